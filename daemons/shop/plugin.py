"""The Shop environment's registration (entry point ``camg.environments``)."""

from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="shop",
    port=65131,
    title="WebShop on the original pyserini/Lucene search",
    factory="daemons.shop.environment:ShopEnvironment",
    settings="daemons.shop.settings:Settings",
    prepare="daemons.shop.prepare:main",
    prepare_hint="python -m camg.prepare_shop",
    unit="camg-shop.service",
    # no helper sandbox: episodes are in-process sessions
    sandboxes_per_episode=0,
)
