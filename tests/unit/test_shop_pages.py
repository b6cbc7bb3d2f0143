"""Pages rendered as upstream WebShop's text environment renders them
(``observation_mode='text'``: visible text nodes of its templates, stripped,
joined with ' [SEP] '). One test per difference the review found, each
against the upstream string. Runs on pages.Store with a fixed search, so it
needs no index."""

import pytest

from environments.shop.pages import Store

INSTRUCTION = "i need a red cotton shirt, and price lower than 30.00 dollars"
HEAD = f"Instruction: [SEP] {INSTRUCTION} [SEP] Back to Search"


def product(asin, **overrides):
    base = {"asin": asin, "Title": f"Title of {asin}", "Price": "$10.0", "Rating": "N.A.",
            "Description": "A shirt.", "BulletPoints": ["soft", "red"], "Reviews": [],
            "options": {"size": ["small", "large"]}, "Attributes": ["cotton"],
            "category": "fashion", "query": "shirts", "product_category": "A › B"}
    return {**base, **overrides}


@pytest.fixture
def store():
    products = {f"B{i:09d}": product(f"B{i:09d}") for i in range(12)}
    products["B0EMPTY000"] = product("B0EMPTY000", Description="", Reviews=[],
                                     BulletPoints=["first", "", "  ", "last"])
    products["B0REVIEW00"] = product("B0REVIEW00", Reviews=[
        {"title": "Great", "score": 5, "body": "fits"}, {"title": "Meh", "score": 2, "body": ""}])
    ranking = list(products)

    def search(keywords):
        return ranking if keywords != "nothing" else []
    return Store(INSTRUCTION, products, search)


def test_next_is_always_shown_as_upstream(store):
    store.apply("search[shirt]")
    assert store.text() == (f"{HEAD} [SEP] Page 1 (Total results: 14) [SEP] Next > [SEP] "
                            + " [SEP] ".join(f"B{i:09d} [SEP] Title of B{i:09d} [SEP] $10.0"
                                             for i in range(10)))
    store.apply("click[next >]")
    assert store.text().startswith(f"{HEAD} [SEP] Page 2 (Total results: 14) [SEP] < Prev "
                                   "[SEP] Next > [SEP] B000000010 [SEP] ")
    # the last page too, and past it an empty page (upstream renders page + 1)
    changed, _ = store.apply("click[next >]")
    assert changed and store.text() == f"{HEAD} [SEP] Page 3 (Total results: 14) [SEP] < Prev [SEP] Next >"
    store.apply("search[nothing]")
    assert store.text() == f"{HEAD} [SEP] Page 1 (Total results: 0) [SEP] Next >"
    assert store.available_actions()["clickables"] == ["back to search", "next >"]


def test_empty_description_shows_nothing(store):
    store.apply("search[shirt]")
    store.results = ["B0EMPTY000"]
    store.apply("click[b0empty000]")
    store.apply("click[description]")
    assert store.text() == f"{HEAD} [SEP] < Prev"      # upstream: no "No Description"


def test_no_reviews_shows_nothing_and_reviews_render_as_upstream(store):
    store.apply("search[shirt]")
    store.results = ["B0EMPTY000", "B0REVIEW00"]
    store.apply("click[b0empty000]")
    store.apply("click[reviews]")
    assert store.text() == f"{HEAD} [SEP] < Prev"      # upstream: no "No reviews found"
    store.apply("click[< prev]")
    store.apply("click[< prev]")
    store.apply("click[b0review00]")
    store.apply("click[reviews]")
    # title in quotes, the score, the body (an empty body leaves no node)
    assert store.text() == f'{HEAD} [SEP] < Prev [SEP] "Great" [SEP] 5 [SEP] fits [SEP] "Meh" [SEP] 2'


def test_empty_bullet_parts_are_kept(store):
    store.apply("search[shirt]")
    store.results = ["B0EMPTY000"]
    store.apply("click[b0empty000]")
    store.apply("click[features]")
    # each bullet is " " + bullet in upstream's page: blank ones are empty parts
    assert store.text() == f"{HEAD} [SEP] < Prev [SEP] first [SEP]  [SEP]  [SEP] last"


def test_search_is_accepted_on_results_and_item_pages(store):
    store.apply("search[shirt]")
    store.apply("click[next >]")
    changed, bought = store.apply("search[nothing]")
    assert (changed, bought) == (True, False)
    assert store.page == "results" and store.page_number == 1 and store.keywords == "nothing"
    store.apply("search[shirt]")
    store.apply("click[b000000003]")
    store.apply("click[large]")
    assert store.options == {"size": "large"}
    changed, _ = store.apply("search[cotton shirt]")
    # a search leaves the item: options and product are forgotten, as upstream
    assert changed and store.page == "results" and store.asin is None and store.options == {}
    store.apply("click[b000000003]")
    store.apply("click[features]")
    assert store.apply("search[shirt]")[0] and store.page == "results"
    # the search bar is still only on the search page (upstream's has_search_bar)
    assert store.available_actions()["has_search_bar"] is False


def test_item_page_renders_as_upstream(store):
    store.apply("search[shirt]")
    store.apply("click[b000000001]")
    assert store.text() == (f"{HEAD} [SEP] < Prev [SEP] size [SEP] small [SEP] large [SEP] "
                            "Title of B000000001 [SEP] Price: $10.0 [SEP] Rating: N.A. [SEP] "
                            "Description [SEP] Features [SEP] Reviews [SEP] Buy Now")


def test_an_option_named_like_a_fixed_clickable_does_not_replace_it():
    """Upstream dispatches click[features] / click[buy now] by name before it
    looks at options: an option value spelled the same never takes them over."""
    products = {"B000000001": product("B000000001", options={
        "style": ["features", "buy now", "plain"], "size": ["plain"]})}
    store = Store(INSTRUCTION, products, lambda keywords: list(products))
    store.apply("search[shirt]")
    store.apply("click[b000000001]")
    kinds = store.clickables()
    assert kinds["features"] == ("sub", None) and kinds["buy now"] == ("buy", None)
    assert kinds["plain"] == ("option", "size")          # later option name, as upstream
    assert store.apply("click[features]") == (True, False) and store.page == "item_sub"
    store.apply("click[< prev]")
    assert store.apply("click[buy now]") == (True, True) and store.options == {}


@pytest.mark.parametrize("page_actions, action, rule", [
    ([], "click[b000000003]", "unreachable_product"),
    (["search[shirt]"], "click[b000000011]", "unreachable_product"),   # on page 2
    (["search[shirt]"], "click[large]", "unreachable_option"),
    (["search[shirt]", "click[b000000001]"], "click[b000000002]", "unreachable_product"),
    (["search[shirt]", "click[b000000001]"], "click[ large]", "not_clickable"),
    (["search[shirt]"], "click[../../etc/passwd]", "not_clickable"),
    (["search[shirt]"], 'click[{"asin": "B000000001"}]', "not_clickable"),
    (["search[shirt]"], "click[search]", "not_clickable"),
    ([], "buy B000000001", "not_an_action"),
    ([], "search[]", "not_an_action"),
])
def test_rejections_name_their_rule_and_change_nothing(store, page_actions, action, rule):
    for done in page_actions:
        assert store.apply(done)[0]
    before = (store.page, store.text(), store.available_actions(), dict(store.options))
    assert store.apply(action) == (False, False)
    assert (store.page, store.text(), store.available_actions(), dict(store.options)) == before
    found, message = store.rejection(action, frozenset({"small", "large"}))
    assert found == rule and ("nothing" in message or "search[keywords]" in message)
