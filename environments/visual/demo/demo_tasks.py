"""The Visual demo task set: webdev requests with reference sites written here.

Each task is a MiMo webdev instance (the row shape of NeMo-Gym's published
webdev example rows) with a brief
written for camg, and a reference site: static HTML that uses the mirrored
Tailwind build and/or inline CSS, plus an inline SVG asset, so a judge has
something real to score and the demo exercises the CDN mirror. The oracle
of a task is one shell action that unpacks its reference site into
/workspace/dist.

    python -m environments.visual.demo.demo_tasks --output DIR
      -> DIR/rows.jsonl, DIR/reference/<task_id>/index.html, DIR/oracle.json
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import tarfile
from pathlib import Path

TAILWIND = '<script src="https://cdn.jsdelivr.net/npm/@tailwindcss/browser@4"></script>'

LOGO = (
    '<svg xmlns="http://www.w3.org/2000/svg" width="160" height="160" viewBox="0 0 160 160">'
    '<circle cx="80" cy="80" r="72" fill="{a}"/><rect x="44" y="44" width="72" height="72" '
    'rx="14" fill="{b}" transform="rotate(12 80 80)"/><circle cx="80" cy="80" r="20" '
    'fill="#fff"/></svg>'
)

TASKS: list[dict] = [
    {
        "instance_id": "camg_webdev_demo_001",
        "problem_statement": (
            "Build a one-page website for a neighbourhood bakery called Crumb & Co. It needs a "
            "hero with the bakery's name and a call to order, a menu of breads and pastries with "
            "prices, opening hours, a short story of the founders, and a contact section. Warm, "
            "friendly colours; use Tailwind."
        ),
        "palette": ("#b45309", "#fde68a"),
        "sections": [
            ("Fresh every morning", "Sourdough, rye and seeded loaves baked before dawn."),
            (
                "Menu",
                "Country sourdough 6.50 - Rye loaf 5.80 - Croissant 2.40 - "
                "Cinnamon bun 3.10 - Fruit tart 4.20",
            ),
            ("Opening hours", "Tue-Fri 7:00-18:00, Sat 7:00-14:00, closed Sun-Mon."),
            ("Our story", "Two friends, one oven and a starter named Gus, since 2014."),
            ("Contact", "12 Mill Lane - hello@crumb.example - 555-0142"),
        ],
        "tailwind": True,
    },
    {
        "instance_id": "camg_webdev_demo_002",
        "problem_statement": (
            "Create a landing page for a note-taking app named Inkwell: a dark theme, a headline "
            "with a sign-up button, three feature cards, a pricing table with free and pro plans, "
            "customer quotes and a footer."
        ),
        "palette": ("#6366f1", "#22d3ee"),
        "sections": [
            ("Write at the speed of thought", "Inkwell keeps every idea one keystroke away."),
            ("Features", "Offline first - Markdown with live preview - End-to-end sync"),
            ("Pricing", "Free: 3 notebooks. Pro: unlimited notebooks and history, 4/month."),
            ("What people say", '"The first notes app I never left." - Dana, editor'),
            ("Footer", "Inkwell Labs - Privacy - Terms - Status"),
        ],
        "tailwind": True,
        "dark": True,
    },
    {
        "instance_id": "camg_webdev_demo_003",
        "problem_statement": (
            "Make a portfolio site for a landscape photographer, Mara Lind, with a large intro, a "
            "gallery grid of her series, an about section, exhibitions with dates and a contact "
            "form (sample fields only). Minimal style with plain CSS, no frameworks."
        ),
        "palette": ("#0f766e", "#99f6e4"),
        "sections": [
            ("Mara Lind - Landscapes", "Light, weather and the northern coastline."),
            ("Gallery", "Tidelines - Fog Studies - Winter Fjords - Salt Marsh"),
            ("About", "Mara has photographed the Norwegian coast for twelve years."),
            ("Exhibitions", "2025 Bergen Kunsthall - 2026 Fotografiska Tallinn"),
            ("Contact", "Name - Email - Message - Send"),
        ],
        "tailwind": False,
    },
    {
        "instance_id": "camg_webdev_demo_004",
        "problem_statement": (
            "Design an event page for a two-day community robotics fair, BotFest: schedule for "
            "both days, speakers with short bios, a venue map placeholder replaced by a drawn "
            "map, ticket tiers and FAQ. Playful, colourful; Tailwind is fine."
        ),
        "palette": ("#db2777", "#fbbf24"),
        "sections": [
            ("BotFest 2026", "Two days of robots, workshops and races. June 6-7."),
            ("Schedule", "Sat: opening, sumo bots, soldering lab. Sun: line-follower race."),
            ("Speakers", "Ada Okafor (swarm robotics) - Lin Wu (soft grippers)"),
            ("Tickets", "Day pass 15 - Weekend 25 - Kids free"),
            ("FAQ", "Can I bring my robot? Yes - register it at the desk."),
        ],
        "tailwind": True,
    },
]


def _site(task: dict) -> str:
    a, b = task["palette"]
    dark = task.get("dark", False)
    if task["tailwind"]:
        body_cls = "bg-slate-900 text-slate-100" if dark else "bg-amber-50 text-stone-800"
        cards = "".join(
            f'<section class="mx-auto max-w-5xl my-10 p-10 rounded-2xl shadow-lg '
            f'{"bg-slate-800" if dark else "bg-white"}"><h2 class="text-3xl font-bold mb-4" '
            f'style="color:{a}">{title}</h2><p class="text-lg leading-8">{text}</p></section>'
            for title, text in task["sections"][1:]
        )
        title, text = task["sections"][0]
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<title>{title}</title>{TAILWIND}</head><body class="{body_cls}">'
            f'<header class="flex items-center gap-10 px-16 py-20" style="background:'
            f'linear-gradient(135deg,{a},{b})"><img src="logo.svg" width="160" '
            f'height="160" alt="logo"><div><h1 class="text-6xl font-extrabold text-white">'
            f'{title}</h1><p class="mt-4 text-2xl text-white">{text}</p><a href="#" '
            f'class="inline-block mt-8 px-8 py-4 rounded-full bg-white font-semibold" '
            f'style="color:{a}">Get started</a></div></header>{cards}'
            f'<footer class="py-10 text-center opacity-70">Demo site for camg</footer>'
            f"</body></html>\n"
        )
    sections = "".join(
        f"<section><h2>{t}</h2><p>{x}</p></section>" for t, x in task["sections"][1:]
    )
    title, text = task["sections"][0]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>body{{margin:0;font-family:'DejaVu Serif',serif;color:#1f2937;background:#f8fafc}}"
        f"header{{display:flex;align-items:center;gap:48px;padding:96px 64px;background:{a};"
        f"color:#fff}}h1{{font-size:56px;margin:0}}header p{{font-size:24px}}"
        f"section{{max-width:960px;margin:40px auto;padding:40px;background:#fff;"
        f"border-left:8px solid {b};box-shadow:0 4px 16px rgba(0,0,0,.08)}}"
        f"h2{{color:{a};font-size:32px}}p{{font-size:19px;line-height:1.7}}</style></head>"
        f'<body><header><img src="logo.svg" width="160" height="160" alt="logo">'
        f"<div><h1>{title}</h1><p>{text}</p></div></header>{sections}</body></html>\n"
    )


def reference_files(task: dict) -> dict[str, bytes]:
    a, b = task["palette"]
    return {"index.html": _site(task).encode(), "logo.svg": LOGO.format(a=a, b=b).encode()}


def oracle_command(files: dict[str, bytes], dist: str = "/workspace/dist") -> str:
    """One shell action that writes ``files`` into dist/ (fits in 16000 characters)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    blob = base64.b64encode(buf.getvalue()).decode()
    command = f"mkdir -p {dist} && echo {blob} | base64 -d | tar -xz -C {dist}"
    assert len(command) <= 16000, "reference site too large for one action"
    return command


def row(task: dict) -> dict:
    """A MiMo webdev instance (the example row's shape)."""
    return {
        "instance": {
            "category": "website",
            "cwd": "/workspace",
            "docker_image": "camg-webdev-demo:latest",
            "problem_statement": task["problem_statement"],
            "task_id": task["instance_id"],
            "dataset_type": "webdev",
            "instance_id": task["instance_id"],
        },
        "subset": "webdev",
    }


def build(output: Path) -> Path:
    output = Path(output)
    (output / "reference").mkdir(parents=True, exist_ok=True)
    oracle = {}
    with open(output / "rows.jsonl", "w", encoding="utf-8") as rows:
        for task in TASKS:
            rows.write(json.dumps(row(task)) + "\n")
            files = reference_files(task)
            site = output / "reference" / task["instance_id"]
            site.mkdir(exist_ok=True)
            for name, data in files.items():
                (site / name).write_bytes(data)
            oracle[task["instance_id"]] = [
                {"operation": "shell", "command": oracle_command(files)},
                {"operation": "finish"},
            ]
    (output / "oracle.json").write_text(json.dumps(oracle, indent=1) + "\n")
    return output / "rows.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m environments.visual.demo.demo_tasks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args(argv)
    print(build(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
