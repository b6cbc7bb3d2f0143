"""The AutoResearch environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="autoresearch",
    port=65133,
    title="research tasks in sandboxes, scored by a private grader",
    factory="daemons.autoresearch.environment:ResearchEnvironment",
    settings="daemons.autoresearch.settings:Settings",
    prepare="daemons.autoresearch.prepare:main",
    prepare_hint="python -m camg.prepare --environment autoresearch",
    unit="camg-autoresearch.service",
)
