"""camg.config.progress: plain periodic lines off a terminal (the journal)."""

from __future__ import annotations

import io
import time

from camg.config import progress


def test_plain_lines_at_a_pace_and_a_final_count():
    out = io.StringIO()
    with progress.Progress("task layers", 3, "task", stream=out, interval=0.0) as bar:
        for _ in range(3):
            bar.update()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("task layers: 1/3 tasks")
    assert lines[-1].startswith("task layers: 3/3 tasks") and lines[-1].endswith("done")
    assert "\r" not in out.getvalue()


def test_no_line_before_the_interval_but_always_the_last():
    out = io.StringIO()
    with progress.Progress("x", None, "candidate", stream=out, interval=3600) as bar:
        bar.update()
        bar.update()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]]
    assert out.getvalue().startswith("x: 2 candidates")


def test_ticking_reports_elapsed_time_and_the_end():
    out = io.StringIO()
    with progress.ticking("index", stream=out, interval=0.05):
        time.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert any(line.startswith("index: ") and line.endswith("…") for line in lines[:-1])
    assert lines[-1].startswith("index: ") and lines[-1].endswith("done")
