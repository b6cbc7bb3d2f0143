"""The AutoResearch environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="autoresearch",
    port=65133,
    title="research tasks in sandboxes, scored by a private grader",
    factory="environments.autoresearch.environment:ResearchEnvironment",
    settings="environments.autoresearch.settings:Settings",
    prepare="environments.autoresearch.prepare:main",
    prepare_hint="python -m camg.prepare --environment autoresearch",
    substrate="sandbox",
    demo={
        "manifest": "/srv/camg/data/autoresearch/manifest.json",
        "capacity": 2,
        "references": True,
        "limits": {"action_timeout_s": 660, "episode_timeout_s": 3900, "idle_ttl_s": 1800},
        "settings": {
            "packages_root": "/var/lib/camg/autoresearch-tasks",
            "workspaces_root": "/var/lib/camg/task-layers/autoresearch",
            "private_root": "/var/lib/camg-grader/answers",
            "images": "/srv/camg/data/autoresearch/materialized-images.json",
            "memory_bytes": 2147483648,
            "cpu_quota": 1.0,
            "disk_bytes": 2147483648,
            "command_minutes": 10,
            "episode_minutes": 60,
        },
    },
    demo_prepare="environments.autoresearch.demo.data:prepare",
    demo_rank=50,
    reliability="environments.autoresearch.checks.reliability:TARGET",
    storm="environments.autoresearch.checks.reliability:storm",
)
