"""The AutoResearch environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

# Its unit's drop-in 20-grader.conf (camg.unit_files).
GRADER_DROPIN = """\
# After 10-environment.conf, whose settings it relaxes for this one service.
#
# The service starts its private grader as a supervised child under the
# camg-grader uid, the only account that can read the private answers. That
# setuid needs CAP_SETUID/CAP_SETGID and the real uid mapping; the worker
# that serves episodes drops both from its effective, permitted, inheritable
# and ambient sets as soon as the grader runs (before any episode is
# admitted), and the grader's child environment is fixed. The gunicorn
# master, which accepts no request, keeps them to start the grader of a
# worker it respawns.
[Service]
PrivateUsers=no
CapabilityBoundingSet=CAP_SETUID CAP_SETGID
AmbientCapabilities=CAP_SETUID CAP_SETGID
# @privileged (denied by 10-environment.conf) holds the set*id calls and
# capset; allow exactly those back.
SystemCallFilter=@setuid capset
"""

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
    canaries="environments.autoresearch.checks.canaries:main",
    bench="environments.autoresearch.checks.bench:main",
    unit_service=(
        "# Fresh state per invocation: nothing of the previous run (sandboxes, their",
        "# disk uppers, the grader) may remain. The check releases what the run",
        "# ledger names and marks the state directory clean; the service refuses to",
        "# start on a directory that is not marked clean.",
        "ExecStartPre=/srv/camg/service-venv/bin/python -m camg.serve "
        "--config /etc/camg/prepared/autoresearch.json --check-clean",
        "MemoryDenyWriteExecute=yes",
        "ProcSubset=pid",
    ),
    unit_dropins=(("20-grader.conf", GRADER_DROPIN),),
)
