"""The scriptable local judge (real OpenAI HTTP protocols) the tests use.

It lives in tools/judge_stub.py since the demo runs it too (runtime tooling
may not import tests/); this module keeps the tests' import path.
"""

from tools.judge_stub import (FakeJudge, Reply, Request, chat_completion,  # noqa: F401
                              response_object)

__all__ = ["FakeJudge", "Reply", "Request", "chat_completion", "response_object"]
