"""The demo task set served from the SWE-smith-shaped demo image.

Same mirror, same branches, same FAIL_TO_PASS/PASS_TO_PASS (the test
environment is the same pinned packages on the same interpreter); only the
rows' ``repo`` owner (which picks SWE-smith's own Python test command, see
environments.coding.profiles) and ``image_name`` change. Preparation with
``--validate`` then checks gold 1.0 / no-op 0.0 on this image, as SWE-smith
validates its instances.
"""

from __future__ import annotations

import json
from pathlib import Path


def rewrite_rows(source: Path, dest: Path) -> list[dict]:
    from environments.coding import profiles
    from tools import oci_demo

    rows = []
    for line in Path(source).read_text().splitlines():
        row = json.loads(line)
        owner, _, name = row["repo"].partition("/")
        if owner != profiles.DEMO_OWNER:
            raise ValueError(f"{row['instance_id']}: not a demo row (repo {row['repo']!r})")
        row["repo"] = f"{profiles.DEMO_SWESMITH_OWNER}/{name}"
        row["image_name"] = oci_demo.SWESMITH_NAME
        rows.append(row)
    Path(dest).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows
