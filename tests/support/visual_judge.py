"""The scripted vision judge of the Visual tests: scores screenshots by simple
image statistics (ink, colours, contrast), deterministic, so a blank page
scores lower than a designed one.

It lives in tools/judge_stub.py since the demo runs it too; this module
keeps the tests' import path.
"""

from tools.judge_stub import (image_from_request, responder, scripted_judge,  # noqa: F401
                              statistics, verdict)

__all__ = ["image_from_request", "responder", "scripted_judge", "statistics", "verdict"]
