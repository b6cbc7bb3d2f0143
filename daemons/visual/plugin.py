"""The Visual environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="visual",
    port=65140,
    title="MiMo webdev tasks: Docker task containers, real screenshots, vision judge",
    factory="daemons.visual.environment:VisualEnvironment",
    settings="daemons.visual.settings:Settings",
    prepare="daemons.visual.prepare:main",
    prepare_hint="python -m camg.prepare --environment visual",
    unit="camg-visual.service",
)
