"""journald-style logging to stderr, the services' format (camg.logs, a
standard-library leaf): "<N>camg.helper: message", no timestamps."""

from __future__ import annotations

import logging

from camg.logs import StderrHandler


def setup(level: int = logging.INFO) -> logging.Logger:
    logger = logging.getLogger("camg.helper")
    if not logger.handlers:
        logger.addHandler(StderrHandler("helper"))
        logger.propagate = False
    logger.setLevel(level)
    return logger
