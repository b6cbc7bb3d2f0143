"""The General environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="general",
    port=65139,
    title="MiMo tasks in Docker containers, LLM judge",
    factory="environments.general.environment:GeneralEnvironment",
    settings="environments.general.settings:Settings",
    prepare="environments.general.prepare:main",
    prepare_hint="python -m camg.prepare --environment general",
    substrate="container",
    # an episode's peak container memory, bounding the default capacity:
    # the transport and a code task's pytest verifier stay well below it
    # (measured by environments/general/checks/bench.py); the bound stays
    # until the other verifiers (jest, a webdev build) are measured too
    episode_peak_bytes=140 << 20,
    demo={
        "manifest": "/srv/camg/data/general/manifest.json",
        "capacity": 4,
        "references": True,
        "limits": {"reset_timeout_s": 300, "action_timeout_s": 1950, "grade_timeout_s": 700},
        "settings": {"pool_size": 1, "cpu": 1.0, "memory_bytes": 1073741824, "pids_max": 512},
    },
    demo_prepare="environments.general.demo.data:prepare",
    # after Coding, whose demo set it reuses
    demo_rank=30,
    demo_images="general/container-images.json",
    demo_agent_env="general/agent-env",
    reliability="environments.general.checks.reliability:TARGET",
    storm="environments.general.checks.reliability:storm",
    canaries="environments.general.checks.canaries:main",
    bench="environments.general.checks.bench:main",
    unit_service=(
        "MemoryDenyWriteExecute=yes",
        "ProcSubset=pid",
        "# The judge's URL, model and key (GA_JUDGE_URL, GA_JUDGE_MODEL, GA_JUDGE_KEY,",
        "# optional GA_JUDGE_API=chat|responses), written by the operator, mode 0600,",
        "# root-owned; never by camg.configure, never logged, never in /metadata.",
        '# "-": without it the service itself refuses to start and names the',
        "# missing variables (as camg.serve --check-config does).",
        "EnvironmentFile=-/etc/camg/credentials/general-judge.env",
        "# The judge is the one remote peer of this unit. The shared loopback-only",
        "# policy denies it: allow its address (and a non-loopback DNS resolver's, if",
        "# GA_JUDGE_URL names a host) in a drop-in, e.g.",
        "#   systemctl edit camg-general  ->  [Service] IPAddressAllow=203.0.113.7/32",
        "# (IPAddressAllow= adds to the list; environments/general/README.md). Task",
        "# containers have no network at all (the helper creates them with none).",
    ),
)
