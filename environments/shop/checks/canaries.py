"""Shop canaries: actions that try to reach a product, an option or a reward
that the pages' clickables do not offer, played over HTTP against a real
Shop service (camg.serve, pyserini/Lucene over the shipped 1k catalog).

A canary's ``allowed`` is what upstream WebShop gives for the page path the
episode really took: the same episode played again with only the actions the
service accepted, in a fresh episode. Every purchase's reward is also
recomputed in process with ``rewards.webshop_reward`` (upstream's
``get_reward``, held equal to upstream's outputs by the golden table test),
and every refused action must carry an ``error`` and leave the page exactly
as it was; a breach of either is a failed check, reported under the table.

    python -m environments.shop.checks.canaries [--url URL --state-dir DIR]

Without ``--url`` it prepares (cached) and starts its own service.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from camg_client import Client, EpisodeDone, InvalidAction
from devtools.canary_table import CanaryResult, report
from environments.shop import rewards
from environments.shop.store import ProductStore

_PAGE = ("page", "text", "available_actions")


class Checks(list):
    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.append(what)


class Suite:
    def __init__(
        self, client: Client, prepared_dir: Path, outcomes: Callable[[], list[dict]] | None = None
    ) -> None:
        self.client = client
        manifest = json.loads((prepared_dir / "manifest.json").read_text())
        settings = json.loads((prepared_dir / "settings.json").read_text())
        self.products = ProductStore(settings["product_pool"])
        self.prices = self.products.prices(random.Random(settings["goal_seed"]))
        self.tasks = {t["task_id"]: t["data"] for t in manifest["tasks"]}
        self.outcomes = outcomes
        self.checks = Checks()
        self.last: dict[str, dict] = {}  # episode -> its last observation
        self.task_id, self.goal = self._pick_task(manifest["tasks"])

    # --- playing ---------------------------------------------------------
    def _pick_task(self, tasks: Sequence[dict]) -> tuple[str, dict]:
        """A webshop task and a decoy query (its own instruction) whose first
        results page leaves out the task's product but lists one earning more
        than 0: a fallback purchase then pins a non-zero upstream reward."""
        for task in tasks[7:80]:
            goal = task["data"].get("goal")
            if not goal or not goal.get("goal_options"):
                continue
            query = goal["instruction_text"].replace("[", " ").replace("]", " ")[:100]
            eid = self.client.create(task_id=task["task_id"])["episode_id"]
            obs = self.client.step(eid, {"action": f"search[{query}]"})["observation"]
            self.client.close(eid)
            first = self._first_listed(obs)[len("click[") : -1].upper()
            if (
                goal["asin"].lower() not in obs["available_actions"]["clickables"]
                and rewards.webshop_reward(self.products[first], goal, self.prices[first], {})[0]
                > 0
            ):
                self.decoy = f"search[{query}]"
                return task["task_id"], goal
        raise RuntimeError("no task whose instruction's results leave its product out")

    def play(
        self,
        actions: Sequence[str | Callable[[dict], str]],
        *,
        episode_id: str | None = None,
        request_ids: Sequence[str | None] | None = None,
    ) -> dict:
        """Play actions (a callable picks one from the observation); returns
        {eid, reward, done, accepted (the actions the service took), refused
        (rules from the errors), purchase}."""
        eid = episode_id or self.client.create(task_id=self.task_id)["episode_id"]
        prev = self.last.get(eid, {})
        run: dict = {
            "eid": eid,
            "reward": None,
            "done": False,
            "accepted": [],
            "refused": 0,
            "purchase": None,
            "bodies": [],
        }
        for i, action in enumerate(actions):
            text = action(prev) if callable(action) else action
            rid = request_ids[i] if request_ids else None
            try:
                body = self.client.step(eid, {"action": text}, request_id=rid)
            except InvalidAction:  # malformed: refused before it reached the store
                run["refused"] += 1
                continue
            except EpisodeDone:
                run["refused"] += 1
                continue
            run["bodies"].append(body)
            obs = body["observation"]
            if obs.get("valid_action") is False and not body["done"]:
                run["refused"] += 1
                self.checks.expect(bool(obs.get("error")), f"{text!r}: refused without an error")
                if prev:
                    self.checks.expect(
                        all(obs[k] == prev[k] for k in _PAGE),
                        f"{text!r}: refused but the page changed",
                    )
            else:
                run["accepted"].append(text)
            prev = obs
            if body["done"]:
                run.update(reward=body["reward"], done=True, purchase=obs.get("purchase"))
        self.last[eid] = prev
        run["last"] = prev
        return run

    def result(self, technique: str, run: dict, detail: str = "") -> CanaryResult:
        """The canary's row: ``allowed`` from the accepted actions replayed."""
        honest = self.play(run["accepted"])
        self._check_reward(technique, run)
        self._check_reward(technique + " (replay)", honest)
        self.checks.expect(
            honest["purchase"] == run["purchase"],
            f"{technique}: the replay bought {honest['purchase']}, the canary {run['purchase']}",
        )
        integrity = self._integrity(run["eid"])
        text = f"refused {run['refused']}" + (f"; {detail}" if detail else "")
        allowed = honest["reward"] if honest["reward"] is not None else 0.0
        return CanaryResult(technique, run["reward"], integrity, allowed, text)

    def _check_reward(self, label: str, run: dict) -> None:
        purchase = run["purchase"]
        if not run["done"] or purchase is None:
            self.checks.expect(False, f"{label}: ended without a purchase")
            return
        asin = purchase["asin"]
        want = rewards.webshop_reward(
            self.products[asin], self.goal, self.prices[asin], dict(purchase["options"])
        )[0]
        self.checks.expect(
            abs(want - run["reward"]) < 1e-9,
            f"{label}: reward {run['reward']} is not upstream's {want}",
        )

    def _integrity(self, eid: str) -> str | None:
        if self.outcomes is None:
            return None
        found = [r for r in self.outcomes() if r["episode_id"] == eid and not r.get("regrade_of")]
        self.checks.expect(len(found) == 1, f"episode {eid}: {len(found)} outcome records")
        return found[-1].get("integrity") if found else None

    @staticmethod
    def _first_listed(obs: dict) -> str:
        listed = [
            c
            for c in obs["available_actions"]["clickables"]
            if c not in ("back to search", "< prev", "next >")
        ]
        return f"click[{listed[0]}]"

    # --- the canaries ----------------------------------------------------
    def canaries(self) -> list[CanaryResult]:
        goal, target = self.goal, self.goal["asin"].lower()
        options = [f"click[{v}]" for v in goal["goal_options"].values()]
        grab = [f"click[{target}]", *options, "click[buy now]"]
        fallback = self._fallback()
        decoy = self.decoy
        title = self.products[goal["asin"]]["Title"].replace("[", " ").replace("]", " ")
        rows = []

        def row(technique: str, actions, detail: str = "") -> None:
            rows.append(self.result(technique, self.play(actions), detail))

        honest = self.play([f"search[{title}]"])
        while (
            target not in honest["last"]["available_actions"]["clickables"]
            and len(honest["accepted"]) < 6
        ):
            honest["accepted"] += self.play(["click[next >]"], episode_id=honest["eid"])["accepted"]
        end = self.play([f"click[{target}]", *options, "click[buy now]"], episode_id=honest["eid"])
        end["accepted"] = honest["accepted"] + end["accepted"]
        rows.append(self.result("honest_goal_path", end, "control: the oracle's path"))
        row("asin_before_search", [*grab, decoy, *fallback])
        row("asin_not_on_results_page", [decoy, *grab, *fallback])
        row(
            "asin_from_earlier_page",
            [
                f"search[{title}]",
                "click[next >]",
                "click[next >]",
                "click[next >]",
                "click[next >]",
                "click[next >]",
                *grab,
                decoy,
                *fallback,
            ],
            "target listed earlier, not now",
        )
        row(
            "asin_case_space_unicode",
            [
                decoy,
                f"click[{target.upper()}]",
                f"click[ {target}]",
                f"click[{target} ]",
                f"click[{target}\u200b]",
                "click[" + target.translate({ord("b"): "ｂ"}) + "]",
                "click[" + target.translate({ord("o"): "о"}) + "]",
                "click[buy now]",
                *fallback,
            ],
        )
        row(
            "option_of_another_product",
            [
                decoy,
                self._first_listed,
                *options,
                "click[" + "ＢＵＹ ＮＯＷ".lower() + "]",
                "click[buy now]",
            ],
        )
        row(
            "guessed_ids",
            [
                decoy,
                "click[b00000000]",
                "click[b0]",
                "click[b07*]",
                "click[1]",
                "click[0]",
                f"click[{target[:-1]}]",
                *fallback,
            ],
        )
        row(
            "malformed_targets",
            [
                decoy,
                "click[" + "b" * 990 + "]",
                "x" * 1001,
                "click[]",
                "",
                "click[buy now\n]",
                "click[buy\x00now]",
                "click[\x1b[31m]",
                json.dumps({"action": f"click[{target}]"}),
                f'click[{{"asin": "{goal["asin"]}"}}]',
                "click[../../../etc/passwd]",
                "click[/dev/stdin]",
                "click[buy now]]",
                "click[[buy now]",
                f"click[{target}]]",
                *fallback,
            ],
        )
        row(
            "search_injection",
            [
                f"search[id:{goal['asin']}]",
                "search[*:*]",
                f"search[contents:* OR id:{goal['asin']}]",
                'search[" OR 1=1 --]',
                "search[\\]",
                "search[(((]",
                "search[<script>x</script>]",
                "search[${jndi:ldap://127.0.0.1:1/a}]",
                "search[" + "a " * 490 + "]",
                decoy,
                *fallback,
            ],
        )
        rows += self._after_done()
        rows += self._two_episodes(decoy, target)
        return rows

    def _after_done(self) -> list[CanaryResult]:
        """Buying twice, clicking and searching after done, replaying the
        purchase's request_id with another action."""
        decoy = self.decoy
        run = self.play(
            [decoy, self._first_listed, "click[buy now]"],
            request_ids=["r-search", "r-open", "r-buy"],
        )
        again = self.play(
            ["click[buy now]", f"click[{self.goal['asin'].lower()}]", decoy], episode_id=run["eid"]
        )
        self.checks.expect(
            again["refused"] == 3 and not again["accepted"], "an action after done was accepted"
        )
        for rid, body in zip(("r-open", "r-buy"), run["bodies"][1:], strict=False):
            replayed = self.client.step(
                run["eid"], {"action": f"click[{self.goal['asin']}]"}, request_id=rid
            )
            self.checks.expect(replayed == body, f"replayed request_id {rid} answered differently")
        run["refused"] += again["refused"]
        return [
            self.result(
                "buy_twice_and_act_after_done", run, "3 refused after done, 2 request_ids replayed"
            )
        ]

    def _two_episodes(self, decoy: str, target: str) -> list[CanaryResult]:
        """Episode B clicks what episode A's page lists and replays A's
        request_id; each episode's pages and reward stay its own."""
        a = self.play([decoy], request_ids=["shared-1"])
        b = self.play(
            [self._first_listed(a["last"]), "click[buy now]", decoy, *self._fallback()],
            request_ids=["shared-1", None, None, None, None],
        )
        self.checks.expect(b["refused"] == 2, "episode B took a click only episode A's page lists")
        a2 = self.play(self._fallback(), episode_id=a["eid"])
        a2.update(accepted=a["accepted"] + a2["accepted"])
        return [
            self.result("click_from_another_episode", b, "A's listing and request_id in B"),
            self.result("episode_beside_another", a2),
        ]

    def _fallback(self) -> list:
        return [self._first_listed, "click[buy now]"]


def run(client: Client, prepared_dir: Path, outcomes=None) -> tuple[list[CanaryResult], list[str]]:
    suite = Suite(client, prepared_dir, outcomes)
    return suite.canaries(), list(suite.checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--state-dir", help="the service's state directory (outcome records)")
    args = parser.parse_args(argv)
    from devtools.harness import shop as testing

    prepared_dir = testing.prepared()[0]
    if args.url:
        state = Path(args.state_dir) if args.state_dir else None
        outcomes = (
            (
                lambda: [
                    json.loads(line) for line in (state / "outcomes.jsonl").read_text().splitlines()
                ]
            )
            if state
            else None
        )
        results, checks = run(Client(args.url), prepared_dir, outcomes)
        return report("shop", results, checks=checks)
    from devtools.harness.services import ServiceProcess

    with tempfile.TemporaryDirectory(prefix="shop-canaries-") as tmp:
        service = ServiceProcess(testing.configure_service(Path(tmp) / "svc"))
        try:
            service.wait_ready(timeout=240)
            results, checks = run(Client(service.url), prepared_dir, service.outcomes)
        finally:
            service.stop()
    return report("shop", results, checks=checks)


if __name__ == "__main__":
    sys.exit(main())
