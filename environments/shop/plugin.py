"""The Shop environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="shop",
    port=65131,
    title="WebShop on the original pyserini/Lucene search",
    factory="environments.shop.environment:ShopEnvironment",
    settings="environments.shop.settings:Settings",
    prepare="environments.shop.prepare:main",
    prepare_hint="python -m camg.prepare_shop",
    # no helper sandbox: episodes are in-process sessions
    substrate="process",
    # what one live session adds to the service, with room over what
    # bench/bench_sessions.py measures (kilobytes: the index and its JVM are
    # shared by every session)
    episode_peak_bytes=64 << 10,
    # its pool and index hashes are recorded by its preparation
    demo={
        "manifest": "/srv/camg/data/shop/manifest.json",
        "references": True,
        "settings": {},
    },
    demo_prepare="environments.shop.demo.data:prepare",
    demo_rank=20,
    reliability="environments.shop.checks.reliability:TARGET",
    storm="environments.shop.checks.reliability:storm",
    canaries="environments.shop.checks.canaries:main",
    bench="environments.shop.checks.bench:main",
    unit_service=(
        "# The Lucene index runs in a JVM (pyserini): its JIT needs writable",
        "# executable memory and its sizing reads /proc/meminfo.",
        "MemoryDenyWriteExecute=no",
        "ProcSubset=all",
    ),
)
