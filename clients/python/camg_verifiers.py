"""verifiers' taskset id for camg services (``--env.taskset.id camg_verifiers``):
verifiers imports a taskset by its module name, which must be top-level.
Everything lives in camg_client/adapters/verifiers.py."""

from camg_client.adapters import verifiers as _adapter

__all__ = ["CamgEnv", "CamgTaskset"]  # noqa: F822  # both come from __getattr__


def __getattr__(name: str):
    return getattr(_adapter, name)
