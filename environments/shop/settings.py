"""The Shop environment's settings (the ``settings`` object of its entry in
the deployment JSON). ``python -m camg.prepare_shop`` writes a matching
``settings.json`` beside the manifest; ``java_home`` comes from
``scripts/prepare_java.py``.
"""

from __future__ import annotations

import dataclasses

from camg.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Settings:
    #: Conda-style Java environment (JAVA_HOME/lib/jvm/lib/server/libjvm.so, JAVA_HOME/bin/java)
    java_home: str
    #: the product store (product_pool.sqlite, environments/shop/store.py) written by
    #: camg.prepare_shop, and its sha256 ("sha256:<hex>"): the pool hash
    product_pool: str
    product_pool_sha256: str
    #: the Lucene index directory, and its tree hash (camg.config.hashing.sha256_tree)
    index_dir: str
    index_sha256: str
    #: the seed prices and goal price caps were drawn with at preparation
    goal_seed: int = 0
    #: JVM heap cap (-Xmx), MiB
    jvm_heap_mb: int = 1024
    #: show the item page's Attributes tab (WebShop's show_attrs; off upstream by default)
    show_attrs: bool = False
    #: steps after which an episode ends unbought (reward 0.0); 0 = no limit
    max_steps: int = 100
    #: compare every stored index document with the pool at start (off: count + sample)
    verify_index_full: bool = True
    #: MemoryArena tasks: how the bought product's name is checked for the
    #: attributes -- "judge" (the LLM attribute judge, MemoryArena's default)
    #: or "substring" (its --no-llm rule: normalised substring match)
    memoryarena_attributes: str = "judge"
    #: environment-variable prefix of the judge's credentials (<prefix>_URL, _MODEL, _KEY, _API)
    memoryarena_judge_env: str = "SHOP_JUDGE"

    def __post_init__(self) -> None:
        for field in ("java_home", "product_pool", "index_dir"):
            if not getattr(self, field).startswith("/"):
                raise ConfigError(f"shop.settings.{field} must be an absolute path")
        for field in ("product_pool_sha256", "index_sha256"):
            value = getattr(self, field)
            if not value.startswith("sha256:") or len(value) != 71:
                raise ConfigError(f"shop.settings.{field} must look like sha256:<64 hex>")
        if not 128 <= self.jvm_heap_mb <= 262144:
            raise ConfigError("shop.settings.jvm_heap_mb must be between 128 and 262144")
        if self.memoryarena_attributes not in ("judge", "substring"):
            raise ConfigError('shop.settings.memoryarena_attributes must be "judge" or "substring"')
        if self.max_steps < 0:
            raise ConfigError("shop.settings.max_steps must be 0 (no limit) or positive")
