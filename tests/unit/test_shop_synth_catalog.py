"""The scale benchmark's catalog synthesis: deterministic, valid for
camg.prepare_shop, real products first and unchanged, synthetic ones
perturbed and never a real ASIN."""

import gzip
import json

from environments.shop import catalog
from environments.shop.checks import synth_catalog


def test_synthesis_is_deterministic_valid_and_perturbed(tmp_path):
    real = synth_catalog.real_products()
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    assert synth_catalog.write_catalog(synth_catalog.synthesize(real, 1300), a) == 1300
    synth_catalog.write_catalog(synth_catalog.synthesize(real, 1300), b)
    assert a.read_bytes() == b.read_bytes()
    rows = list(catalog.read_catalog_documents(a))
    products = catalog.select_products(rows, str(a))     # what prepare_shop reads
    assert len(products) == 1300
    assert [p["asin"] for p in products[:1000]] == [p["asin"] for p in real]
    assert products[:1000] == real
    synthetic = products[1000:]
    real_asins = {p["asin"] for p in real}
    assert len({p["asin"] for p in synthetic}) == 300
    assert not real_asins & {p["asin"] for p in synthetic}
    for index, product in enumerate(synthetic, 1000):
        base = real[index % 1000]
        assert product["Title"] != base["Title"] and product["name"] == product["Title"]
        assert "instruction_text" not in product
        assert product["query"] == base["query"]
    # the search text is recomputed from the perturbed product
    assert rows[1000]["contents"] == catalog.document(synthetic[0])["contents"]
    assert synthetic[0]["Title"].lower() in rows[1000]["contents"]
    # a larger catalog starts with the smaller one
    c = tmp_path / "c.jsonl"
    synth_catalog.write_catalog(synth_catalog.synthesize(real, 1400), c)
    head = [json.loads(line) for line in c.read_text().splitlines()[:1300]]
    with gzip.open(a, "rt") as handle:
        assert head == [json.loads(line) for line in handle]


def test_cli_refuses_fewer_than_the_real_products(tmp_path):
    assert synth_catalog.main(["--products", "10", "--output", str(tmp_path / "x.jsonl")]) == 2
