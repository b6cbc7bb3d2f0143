"""The Coding environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="coding",
    port=65134,
    title="SWE-smith tasks graded with swebench",
    factory="environments.coding.environment:CodingEnvironment",
    settings="environments.coding.settings:Settings",
    prepare="environments.coding.prepare:main",
    prepare_hint="python -m camg.prepare --environment coding",
    substrate="sandbox",
    # its agent sandbox, and a fresh one while grading
    sandboxes_per_episode=2,
    demo={
        "manifest": "/srv/camg/data/coding/manifest.json",
        "capacity": 2,
        "references": True,
        "settings": {
            "mirrors_root": "/srv/camg/data/coding/demo/mirrors",
            "images": "/srv/camg/data/coding/materialized-images.json",
        },
    },
    demo_prepare="environments.coding.demo.data:prepare",
    demo_rank=10,
    reliability="environments.coding.checks.reliability:TARGET",
    storm="environments.coding.checks.reliability:storm",
    canaries="environments.coding.checks.canaries:main",
    bench="environments.coding.checks.bench:main",
)
