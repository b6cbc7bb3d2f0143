"""Dataset environments by ``dataset_type``."""

from __future__ import annotations

from mimoagent.environments.datasets.base import DatasetEnvironment
from mimoagent.environments.datasets.general_agent import GeneralAgentEnvironment
from mimoagent.environments.datasets.opensource_code import OpenSourceCodeEnvironment

DATASET_REGISTRY: dict[str, type[DatasetEnvironment]] = {
    "opensource-code": OpenSourceCodeEnvironment,
    "general_agent": GeneralAgentEnvironment,
}


def make_dataset_env(instance: dict, environment_class=None, **env_kwargs) -> DatasetEnvironment:
    from mimoagent.environments.local import LocalEnvironment

    cls = DATASET_REGISTRY.get(instance.get("dataset_type", ""))
    if cls is None:
        raise ValueError(f"unknown dataset_type {instance.get('dataset_type')!r}")
    base = (environment_class or LocalEnvironment)(**{"cwd": instance.get("cwd", "/"), **env_kwargs})
    return cls(base, instance)
