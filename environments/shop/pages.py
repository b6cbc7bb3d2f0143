"""The simulated store one episode browses: WebShop's pages, clickables and
text observations (``observation_mode='text'``: visible texts joined with
`` [SEP] ``).

Pages and what can be clicked on them (all clickables lowercased, as the
text environment lowercases the action argument):

* search — the search box (``search[...]``; ``search`` itself is listed as
  a clickable but clicking it does nothing, as upstream)
* results — ``back to search``, ``< prev`` (page > 1), ``next >`` (always,
  as upstream: past the last hit it shows an empty page), and each result's
  ASIN; top 50 hits, 10 per page
* item — ``back to search``, ``< prev``, ``description``, ``features``,
  ``reviews`` (and ``attributes`` when shown), ``buy now``, and every option
  value
* item_sub — ``back to search``, ``< prev``
* done — nothing

``search[...]`` works from every page but the done page, as in upstream's
text environment (its search bar is only on the search page, but its
``step`` runs any search action). An action that is neither a search nor
``click[x]`` on a listed clickable changes nothing (``apply`` returns False,
as upstream's step returns the same page); ``rejection`` names why, for the
observation's ``error`` and the outcome's evidence. An option value that
equals a fixed clickable (``features``, ``buy now``...) does not replace it:
upstream dispatches a click by those names before it looks at options.

Text follows upstream's ``observation_mode='text'``: the visible text nodes
of the page, stripped and joined with `` [SEP] ``. A value rendered into an
empty element leaves no node; a whitespace-only node without a newline
stays as an empty part (an empty bullet point gives ``[SEP]  [SEP]``), one
with a newline is dropped (BeautifulSoup collapses it to ``\n``, which
upstream skips). Nothing is invented for empty texts.

The observation never marks the goal's product: result lists are the
search engine's ranking, unfiltered and unannotated, and the done page
shows only the score (upstream's done page embeds the goal in a hidden
block that its text mode would leak; we render none of it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Mapping
from typing import Any

from camg.errors import InvalidAction

PRODUCT_WINDOW = 10
SEP = " [SEP] "
_ACTION = re.compile(r"(.+)\[(.+)\]")
SUB_PAGES = ("description", "features", "reviews", "attributes")


def parse_action(action: str) -> tuple[str, str | None]:
    """Upstream ``parse_action``: ``name[arg]`` -> (name, arg), else (action, None)."""
    match = _ACTION.match(action)
    if match is None:
        return action, None
    return match.group(1), match.group(2)


class Store:
    """Page state of one episode; not thread-safe (the episode serialises steps)."""

    def __init__(
        self,
        instruction: str,
        products: Mapping[str, Mapping[str, Any]],
        search: Callable[[str], list[str]],
        *,
        show_attrs: bool = False,
    ) -> None:
        self.instruction = instruction
        self._products = products
        self._search = search
        self._show_attrs = show_attrs
        self.page = "search"
        self.keywords: str | None = None
        self.results: list[str] = []
        self.page_number = 1
        self.asin: str | None = None
        self.options: dict[str, str] = {}
        self.sub_page: str | None = None
        self.score: float | None = None

    # --- what the agent can do here -------------------------------------
    def clickables(self) -> dict[str, tuple[str, str | None]]:
        """Clickable text -> (kind, option name); insertion order is page order."""
        page = self.page
        items: dict[str, tuple[str, str | None]] = {}
        if page == "search":
            items["search"] = ("search", None)
        elif page == "results":
            items["back to search"] = ("back", None)
            if self.page_number > 1:
                items["< prev"] = ("prev", None)
            items["next >"] = ("next", None)
            for asin in self._page_results():
                items[asin.lower()] = ("product", None)
        elif page == "item":
            items["back to search"] = ("back", None)
            items["< prev"] = ("prev", None)
            for sub in SUB_PAGES:
                if sub != "attributes" or self._show_attrs:
                    items[sub] = ("sub", None)
            items["buy now"] = ("buy", None)
            for name, values in self._product()["options"].items():
                for value in values:
                    # a value offered under two option names selects the
                    # later one, as upstream's dict of radio inputs does
                    if items.get(value, ("option", None))[0] == "option":
                        items[value] = ("option", name)
        elif page == "item_sub":
            items["back to search"] = ("back", None)
            items["< prev"] = ("prev", None)
        return items

    def available_actions(self) -> dict:
        return {"has_search_bar": self.page == "search", "clickables": list(self.clickables())}

    def rejection(
        self, action: str, option_values: Container[str] = frozenset()
    ) -> tuple[str, str]:
        """(rule, message) for an action ``apply`` just ignored. Rules:
        ``unreachable_product`` (a catalog ASIN this page does not list),
        ``unreachable_option`` (an option value of some product this page
        does not offer), ``not_clickable`` (any other click), ``not_an_action``
        (no ``search[...]``/``click[...]`` form)."""
        name, arg = parse_action(action)
        shown = repr(action[:80])
        if name != "click" or arg is None:
            return "not_an_action", (
                f"{shown} is not search[keywords] or click[<clickable>]; nothing changed"
            )
        arg = arg.lower()
        where = f"this {self.page} page"
        if arg == "search":
            return "not_clickable", "click[search] does nothing: use search[keywords]"
        if arg.upper() in self._products:
            return "unreachable_product", (
                f"{shown}: that product is not listed on {where}; nothing changed"
            )
        if arg in option_values:
            return "unreachable_option", (
                f"{shown}: that option is not offered on {where}; nothing changed"
            )
        return "not_clickable", (
            f"{shown} is not one of {where}'s clickables "
            "(observation.available_actions.clickables); nothing changed"
        )

    # --- transitions -----------------------------------------------------
    def apply(self, action: str) -> tuple[bool, bool]:
        """Apply one action string; returns (changed anything, bought)."""
        if self.page == "done":
            raise InvalidAction("the episode is over: the product was bought")
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        if name == "search" and arg:
            self.keywords = arg
            # upstream splits the argument on spaces and joins the words again
            self.results = self._search(" ".join(arg.split(" ")))
            self.page_number = 1
            self._to_results()
            return True, False
        if name != "click" or arg is None or arg == "search":
            return False, False
        target = self.clickables().get(arg)
        if target is None:
            return False, False
        kind, option_name = target
        if kind == "back":
            self.page, self.keywords, self.results = "search", None, []
            self.page_number, self.asin, self.options, self.sub_page = 1, None, {}, None
        elif kind == "next":
            self.page_number += 1
            self._to_results()
        elif kind == "prev" and self.page == "results":
            self.page_number -= 1
            self._to_results()
        elif kind == "prev" and self.page == "item":
            self._to_results()
        elif kind == "prev":
            self.page, self.sub_page = "item", None
        elif kind == "product":
            self.page, self.asin, self.options = "item", arg.upper(), {}
        elif kind == "option":
            assert option_name is not None  # every option clickable names its option
            self.options[option_name] = arg
        elif kind == "sub":
            self.page, self.sub_page = "item_sub", arg
        elif kind == "buy":
            self.page = "done"
            return True, True
        return True, False

    def _to_results(self) -> None:
        self.page, self.asin, self.options, self.sub_page = "results", None, {}, None

    def _page_results(self) -> list[str]:
        start = (self.page_number - 1) * PRODUCT_WINDOW
        return self.results[start : start + PRODUCT_WINDOW]

    def _product(self) -> Mapping[str, Any]:
        assert self.asin is not None  # only the product's pages ask for it
        return self._products[self.asin]

    # --- rendering -------------------------------------------------------
    def text(self) -> str:
        if self.page == "search":
            parts = ["WebShop", "Instruction:", _node(self.instruction), "Search"]
        elif self.page == "done":
            parts = [
                "Thank you for shopping with us!",
                "Your score (min 0.0, max 1.0)",
                f"{self.score}",
            ]
        else:
            parts = ["Instruction:", _node(self.instruction), "Back to Search"]
            parts += getattr(self, f"_text_{self.page}")()
        return SEP.join(p for p in parts if p is not None)

    def _text_results(self) -> list[str | None]:
        parts: list[str | None] = [f"Page {self.page_number} (Total results: {len(self.results)})"]
        if self.page_number > 1:
            parts.append("< Prev")
        parts.append("Next >")
        for asin in self._page_results():
            product = self._products[asin]
            parts += [_node(asin), _node(product["Title"]), _node(product["Price"])]
        return parts

    def _text_item(self) -> list[str | None]:
        product = self._product()
        parts: list[str | None] = ["< Prev"]
        for name, values in product["options"].items():
            parts.append(_node(name))
            parts += [_node(v) for v in values]
        parts += [
            _node(product["Title"]),
            _node(f"Price: {product['Price']}"),
            _node(f"Rating: {product.get('Rating', '')}"),
            "Description",
            "Features",
            "Reviews",
        ]
        if self._show_attrs:
            parts.append("Attributes")
        parts.append("Buy Now")
        return parts

    def _text_item_sub(self) -> list[str | None]:
        product = self._product()
        parts: list[str | None] = ["< Prev"]
        if self.sub_page == "description":
            parts.append(_node(product["Description"]))
        elif self.sub_page == "features":
            # upstream's bullet element holds " " + the bullet
            parts += [_node(" " + bullet) for bullet in product["BulletPoints"]]
        elif self.sub_page == "reviews":
            for review in product.get("Reviews") or []:
                parts += [
                    _node(f'"{_str(review.get("title"))}"'),
                    _node(_str(review.get("score"))),
                    _node(_str(review.get("body"))),
                ]
        else:
            parts += [_node(" " + attr) for attr in product["Attributes"]]
            parts += [
                _node(product["category"]),
                _node(product["query"]),
                _node(product["product_category"]),
            ]
        return parts


def _str(value: Any) -> str:
    """A value as the template prints it (a missing one prints nothing)."""
    return "" if value is None else str(value)


def _node(text: str) -> str | None:
    """The part one rendered text node gives, or None when it gives none:
    an empty value makes no node, and a whitespace-only node holding a
    newline is the ``\\n`` upstream skips; any other node is stripped (so a
    blank one is an empty part)."""
    if not text or (not text.strip() and "\n" in text):
        return None
    return text.strip()
