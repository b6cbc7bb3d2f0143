"""Which class implements each product environment.

Names are resolved lazily so that serving Shop never imports the Coding
stack (and vice versa). A deployment may name a ``factory`` for an
environment that is not a product environment (the test suite's framework
environment does this); product names always use this table.
"""

from __future__ import annotations

import importlib

from camg.errors import ConfigError

PORTS = {
    "shop": 65131,
    "autoresearch": 65133,
    "coding": 65134,
    "general": 65139,
    "visual": 65140,
}

FACTORIES = {
    "shop": "daemons.shop.environment:ShopEnvironment",
    "coding": "daemons.coding.environment:CodingEnvironment",
}


def resolve(spec: str) -> type:
    """Import ``module:Class``; a ConfigError names what failed."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"factory {spec!r} must look like 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load environment factory {spec!r}: {exc}") from None
