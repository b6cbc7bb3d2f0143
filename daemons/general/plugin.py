"""The General environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="general",
    port=65139,
    title="MiMo tasks in Docker containers, LLM judge",
    factory="daemons.general.environment:GeneralEnvironment",
    settings="daemons.general.settings:Settings",
    prepare="daemons.general.prepare:main",
    prepare_hint="python -m camg.prepare --environment general",
    unit="camg-general.service",
)
