"""Demo ``general_agent`` tasks: office work on CSV/XLSX/SQLite files with MCP tools.

Each task directory follows upstream's layout (FACTS 1.4): ``workspace/``
(the files the agent works on, made here: CSV, XLSX via openpyxl, SQLite),
``tools/<server>.py`` (one MCP server per file, stdio, ``mcp`` 2.x
``MCPServer``) backed by ``system/<server>/state.db``, ``verifier_meta.json``
(the rubric: rule items checked against the post-state, LLM items judged on
the workspace text with a hidden pass anchor) and ``instance.json``. Next to
it (not in any image) ``oracle.json`` holds actions that solve the task,
for tests and the demo. All data is generated deterministically here.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from pathlib import Path

CWD = "/work/workspace"
SALES_ID = "s3k_demo_sales_ops_en_t1_rl_001"
INVENTORY_ID = "s3k_demo_inventory_reorder_en_t1_rl_002"
AGENT_PY = "/opt/camg/agent-env/bin/python"

REGIONS = ("North", "South", "East", "West")
PRODUCTS = {
    "P-100": ("Desk lamp", 24.5),
    "P-200": ("Office chair", 149.0),
    "P-300": ("Monitor stand", 39.9),
    "P-400": ("Cable tray", 12.25),
}

CRM_SERVER = '''"""CRM tools over the task's SQLite state (MIMO_STATE_DB)."""
import os
import sqlite3

from mcp.server.mcpserver import MCPServer

DB = os.environ["MIMO_STATE_DB"]
app = MCPServer("crm")


def _conn():
    return sqlite3.connect(DB)


@app.tool()
def list_customers(region: str = "") -> list[dict]:
    """List customers (id, name, region, tier), optionally of one region."""
    with _conn() as c:
        rows = c.execute("SELECT id, name, region, tier FROM customers WHERE ? = '' OR region = ? "
                         "ORDER BY id", (region, region)).fetchall()
    return [dict(zip(("id", "name", "region", "tier"), r)) for r in rows]


@app.tool()
def set_tier(customer_id: str, tier: str) -> str:
    """Set a customer's tier: one of standard, silver, gold."""
    if tier not in ("standard", "silver", "gold"):
        raise ValueError("tier must be standard, silver or gold")
    with _conn() as c:
        if c.execute("UPDATE customers SET tier = ? WHERE id = ?", (tier, customer_id)).rowcount != 1:
            raise ValueError(f"no customer {customer_id}")
    return f"{customer_id} is now {tier}"


if __name__ == "__main__":
    app.run()
'''  # noqa: E501  (the task's server source, kept as shipped)

TICKETS_SERVER = '''"""Ticket tools over the task's SQLite state (MIMO_STATE_DB)."""
import os
import sqlite3

from mcp.server.mcpserver import MCPServer

DB = os.environ["MIMO_STATE_DB"]
app = MCPServer("tickets")


@app.tool()
def create_ticket(title: str, body: str = "") -> int:
    """Open a ticket; returns its number."""
    with sqlite3.connect(DB) as c:
        return c.execute("INSERT INTO tickets (title, body) VALUES (?, ?)", (title, body)).lastrowid


@app.tool()
def list_tickets() -> list[dict]:
    """All tickets (number, title)."""
    with sqlite3.connect(DB) as c:
        return [{"number": n, "title": t} for n, t in c.execute("SELECT id, title FROM tickets")]


if __name__ == "__main__":
    app.run()
'''

PROCUREMENT_SERVER = '''"""Purchasing tools over the task's SQLite state (MIMO_STATE_DB)."""
import os
import sqlite3

from mcp.server.mcpserver import MCPServer

DB = os.environ["MIMO_STATE_DB"]
app = MCPServer("procurement")


@app.tool()
def place_order(sku: str, quantity: int) -> str:
    """Order ``quantity`` units of ``sku`` from the supplier."""
    if quantity <= 0:
        raise ValueError("quantity must be positive")
    with sqlite3.connect(DB) as c:
        c.execute("INSERT INTO orders (sku, quantity) VALUES (?, ?)", (sku, quantity))
    return f"ordered {quantity} x {sku}"


@app.tool()
def list_orders() -> list[dict]:
    """Orders placed so far."""
    with sqlite3.connect(DB) as c:
        return [{"sku": s, "quantity": q} for s, q in c.execute("SELECT sku, quantity FROM orders")]


if __name__ == "__main__":
    app.run()
'''


def _sales_rows() -> list[dict]:
    rows, n = [], 0
    for month in (7, 8, 9):
        for i, region in enumerate(REGIONS):
            for j, (sku, (_, _price)) in enumerate(sorted(PRODUCTS.items())):
                n += 1
                qty = 1 + (month * 7 + i * 5 + j * 3) % 9
                rows.append(
                    {
                        "order_id": f"O-{n:04d}",
                        "month": f"2025-{month:02d}",
                        "region": region,
                        "sku": sku,
                        "quantity": qty,
                    }
                )
    return rows


def _db(path: Path, script: str, rows: dict[str, list[tuple]] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.executescript(script)
        for table, values in (rows or {}).items():
            marks = ",".join("?" * len(values[0]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", values)


def _instance(task_id: str, statement: str, image: str = "") -> dict:
    return {
        "instance_id": task_id,
        "dataset_type": "general_agent",
        "docker_image": image,
        "env_task_dir": f"envs/{task_id}",
        "cwd": CWD,
        "problem_statement": statement,
        "num_turns": 1,
        "verifier_timeout_sec": 300,
    }


def sales_task(out: Path) -> Path:
    import openpyxl

    task_id = SALES_ID
    root = out / task_id
    shutil.rmtree(root, ignore_errors=True)
    ws = root / "workspace"
    ws.mkdir(parents=True)
    sales = _sales_rows()
    with open(ws / "sales.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(sales[0]))
        writer.writeheader()
        writer.writerows(sales)
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Prices"
    sheet.append(["sku", "name", "unit_price"])
    for sku, (name, price) in sorted(PRODUCTS.items()):
        sheet.append([sku, name, price])
    book.save(ws / "pricing.xlsx")
    revenue = {r: 0.0 for r in REGIONS}
    for row in sales:
        revenue[row["region"]] += row["quantity"] * PRODUCTS[row["sku"]][1]
    revenue = {r: round(v, 2) for r, v in revenue.items()}
    top = max(revenue, key=revenue.__getitem__)
    tools = root / "tools"
    tools.mkdir()
    (tools / "crm.py").write_text(CRM_SERVER)
    (tools / "tickets.py").write_text(TICKETS_SERVER)
    customers = [
        (f"C{n:03d}", name, REGIONS[n % 4], "standard")
        for n, name in enumerate(
            ("Acme Corp", "Birch Ltd", "Cobalt AG", "Dune LLC", "Elm & Co", "Fjord AS"), 1
        )
    ]
    _db(
        root / "system" / "crm" / "state.db",
        "CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT, region TEXT, tier TEXT);",
        {"customers": customers},
    )
    _db(
        root / "system" / "tickets" / "state.db",
        "CREATE TABLE tickets (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT, body TEXT);",
    )
    top_customers = [c[0] for c in customers if c[2] == top]
    statement = (
        "You are helping the sales operations team close the quarter.\n"
        f"1. Using sales.csv (orders: quantity per sku) and pricing.xlsx (unit prices), "
        "compute the "
        "Q3 revenue of each region. Write summary.xlsx in the workspace with a sheet named "
        "'Summary': header row 'region','revenue', then one row per region in the order North, "
        "South, East, West, revenue rounded to 2 decimals.\n"
        "2. In the CRM, set every customer of the top-revenue region to tier 'gold'.\n"
        "3. Open a ticket titled 'Q3 revenue review' in the ticket system.\n"
        "4. Finish with a short answer naming the top region and its revenue.\n"
        "Do not modify sales.csv or pricing.xlsx. Python with openpyxl is available as "
        f"{AGENT_PY}."
    )
    items = [
        {
            "id": "src_protect",
            "method": "rule",
            "kind": "unchanged",
            "gate": True,
            "files": ["sales.csv", "pricing.xlsx"],
            "question": "Source files unchanged",
        },
        {
            "id": "summary_top",
            "method": "rule",
            "kind": "xlsx_cell",
            "file": "summary.xlsx",
            "sheet": "Summary",
            "cell": f"B{2 + REGIONS.index(top)}",
            "expect": revenue[top],
            "tolerance": 0.01,
            "weight": 2,
            "question": "Top region revenue in the summary",
        },
        {
            "id": "summary_north",
            "method": "rule",
            "kind": "xlsx_cell",
            "file": "summary.xlsx",
            "sheet": "Summary",
            "cell": "B2",
            "expect": revenue["North"],
            "tolerance": 0.01,
            "question": "North revenue in the summary",
        },
        {
            "id": "crm_gold",
            "method": "rule",
            "kind": "sql",
            "server": "crm",
            "query": "SELECT id FROM customers WHERE tier = 'gold' ORDER BY id",
            "expect": [[c] for c in top_customers],
            "question": "Top region's customers are gold",
        },
        {
            "id": "ticket",
            "method": "rule",
            "kind": "sql",
            "server": "tickets",
            "query": "SELECT count(*) FROM tickets WHERE title = 'Q3 revenue review'",
            "expect": [[1]],
            "question": "Review ticket opened once",
        },
        {
            "id": "answer_top",
            "method": "llm",
            "files": ["answer.md"],
            "weight": 2,
            "question": "Does the final answer name the top-revenue region and its Q3 revenue?",
            "pass_anchor": f"{top}, {revenue[top]:.2f}",
        },
    ]
    (root / "verifier_meta.json").write_text(json.dumps({"items": items}, indent=1))
    (root / "instance.json").write_text(json.dumps(_instance(task_id, statement), indent=1))
    script = (
        "import openpyxl, csv\nprices = {r[0]: r[2] for r in openpyxl.load_workbook('pricing.xlsx')"
        "['Prices'].iter_rows(min_row=2, values_only=True)}\n"
        "rev = {}\nfor row in csv.DictReader(open('sales.csv')):\n"
        "    rev[row['region']] = rev.get(row['region'], 0) "
        "+ int(row['quantity']) * prices[row['sku']]\n"
        "b = openpyxl.Workbook(); s = b.active; s.title = 'Summary'; "
        "s.append(['region', 'revenue'])\n"
        "for r in ('North', 'South', 'East', 'West'):\n    s.append([r, round(rev[r], 2)])\n"
        "b.save('summary.xlsx')\n"
    )
    oracle: list[dict] = [{"operation": "shell", "command": f"{AGENT_PY} - <<'PY'\n{script}PY"}]
    oracle += [
        {
            "operation": "tool",
            "server": "crm",
            "name": "set_tier",
            "arguments": {"customer_id": c, "tier": "gold"},
        }
        for c in top_customers
    ]
    oracle += [
        {
            "operation": "tool",
            "server": "tickets",
            "name": "create_ticket",
            "arguments": {"title": "Q3 revenue review"},
        },
        {"operation": "finish", "answer": f"Top region: {top} with Q3 revenue {revenue[top]:.2f}."},
    ]
    (out / f"{task_id}.oracle.json").write_text(json.dumps(oracle, indent=1))
    return root


def inventory_task(out: Path) -> Path:
    task_id = INVENTORY_ID
    root = out / task_id
    shutil.rmtree(root, ignore_errors=True)
    ws = root / "workspace"
    ws.mkdir(parents=True)
    stock = [
        (f"SKU-{n:03d}", name, (n * 37) % 50, 20 if n % 2 else 15)
        for n, name in enumerate(
            ("bolts", "nuts", "washers", "screws", "rivets", "hinges", "brackets", "clamps"), 1
        )
    ]
    _db(
        ws / "inventory.sqlite",
        "CREATE TABLE stock "
        "(sku TEXT PRIMARY KEY, name TEXT, on_hand INTEGER, reorder_level INTEGER);",
        {"stock": stock},
    )
    low = sorted((sku, level * 2 - on_hand) for sku, _, on_hand, level in stock if on_hand < level)
    tools = root / "tools"
    tools.mkdir()
    (tools / "procurement.py").write_text(PROCUREMENT_SERVER)
    _db(
        root / "system" / "procurement" / "state.db",
        "CREATE TABLE orders (sku TEXT, quantity INTEGER);",
    )
    statement = (
        "The warehouse keeps its stock in inventory.sqlite (table stock: sku, name, on_hand, "
        "reorder_level). For every item whose on_hand is below its reorder_level, place one "
        "purchase order (procurement tool) bringing it to twice its reorder level "
        "(quantity = 2 * reorder_level - on_hand). Then finish with a list of the SKUs you "
        "ordered and the quantities. Do not modify inventory.sqlite."
    )
    items = [
        {
            "id": "src_protect",
            "method": "rule",
            "kind": "unchanged",
            "gate": True,
            "files": ["inventory.sqlite"],
            "question": "Inventory unchanged",
        },
        {
            "id": "orders",
            "method": "rule",
            "kind": "sql",
            "server": "procurement",
            "weight": 3,
            "query": "SELECT sku, quantity FROM orders ORDER BY sku",
            "expect": [list(x) for x in low],
            "question": "Exactly the needed orders were placed",
        },
        {
            "id": "answer_lists",
            "method": "llm",
            "files": ["answer.md"],
            "question": "Does the answer list every ordered SKU with its quantity?",
            "pass_anchor": "; ".join(f"{s} x {q}" for s, q in low),
        },
    ]
    (root / "verifier_meta.json").write_text(json.dumps({"items": items}, indent=1))
    (root / "instance.json").write_text(json.dumps(_instance(task_id, statement), indent=1))
    oracle: list[dict] = [
        {
            "operation": "shell",
            "command": 'python3 -c "import sqlite3; print(sqlite3.connect('
            "'inventory.sqlite').execute('select * from stock where on_hand < reorder_level')"
            '.fetchall())"',
        }
    ]
    oracle += [
        {
            "operation": "tool",
            "server": "procurement",
            "name": "place_order",
            "arguments": {"sku": s, "quantity": q},
        }
        for s, q in low
    ]
    oracle += [
        {"operation": "finish", "answer": "Ordered: " + "; ".join(f"{s} x {q}" for s, q in low)}
    ]
    (out / f"{task_id}.oracle.json").write_text(json.dumps(oracle, indent=1))
    return root


def build_all(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [sales_task(out), inventory_task(out)]
