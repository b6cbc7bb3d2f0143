"""The Coding environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="coding",
    port=65134,
    title="SWE-smith tasks graded with swebench",
    factory="daemons.coding.environment:CodingEnvironment",
    settings="daemons.coding.settings:Settings",
    prepare="daemons.coding.prepare:main",
    prepare_hint="python -m camg.prepare --environment coding",
    unit="camg-coding.service",
    # its agent sandbox, and a fresh one while grading
    sandboxes_per_episode=2,
)
