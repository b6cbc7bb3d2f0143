"""The Visual environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="visual",
    port=65140,
    title="MiMo webdev tasks: Docker task containers, real screenshots, vision judge",
    factory="environments.visual.environment:VisualEnvironment",
    settings="environments.visual.settings:Settings",
    prepare="environments.visual.prepare:main",
    prepare_hint="python -m camg.prepare --environment visual",
    substrate="container",
    # its renderer sandbox's memory cgroup at a render, which dominates (the
    # task container idles far below it; environments/visual/checks/bench.py)
    episode_peak_bytes=200 << 20,
    demo={
        "manifest": "/srv/camg/data/visual/manifest.json",
        "capacity": 2,
        "references": True,
        "limits": {"action_timeout_s": 300, "grade_timeout_s": 900},
        "settings": {"pool_size": 1, "cpu": 1.0, "memory_bytes": 1073741824, "pids_max": 512},
    },
    demo_prepare="environments.visual.demo.data:prepare",
    demo_rank=40,
    demo_images="visual/images.json",
    reliability="environments.visual.checks.reliability:TARGET",
    storm="environments.visual.checks.reliability:storm",
    canaries="environments.visual.checks.canaries:main",
    bench="environments.visual.checks.bench:main",
    unit_service=(
        "MemoryDenyWriteExecute=yes",
        "ProcSubset=pid",
        "# The vision judge's WD_JUDGE_URL, WD_JUDGE_MODEL and WD_JUDGE_KEY come only",
        "# from here (the operator writes this root-owned 0600 file; configure never",
        '# does). "-": without it the service itself refuses to start and names the',
        "# missing variables (as camg.serve --check-config does).",
        "EnvironmentFile=-/etc/camg/credentials/visual-judge.env",
        "# The judge is the one remote peer of this unit. The shared loopback-only",
        "# policy denies it: allow its address (and a non-loopback DNS resolver's, if",
        "# WD_JUDGE_URL names a host) in a drop-in, e.g.",
        "#   systemctl edit camg-visual  ->  [Service] IPAddressAllow=203.0.113.7/32",
        "# (IPAddressAllow= adds to the list; environments/visual/README.md). The",
        "# renderer sandbox has no network at all; only the service talks to the judge.",
    ),
)
