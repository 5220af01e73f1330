"""Tests for prismbench/dashboard.py and `prismbench dashboard`."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from prismbench import history
from prismbench.cli import main
from prismbench.validate import CaseResult, MetricResult


def _run(db, run_id: str, commit: str, errors: dict[str, float], status: str = "complete") -> None:
    history.start_run(db, run_id, commit=commit, dirty=False, machine="m", settings={})
    for name, error in errors.items():
        case = CaseResult(baseline=name, source=name.split("__")[0], gpu="h100-sxm-80g", world_size=8,
                          status="ok", wall_s=1.0,
                          metrics=[MetricResult("iteration_time_s", 1.0 + error, 1.0)])  # fmt: skip
        history.add_case(db, run_id, case)
    if status != "running":
        history.finish_run(db, run_id, status)


def test_page_and_figures_from_the_history(tmp_path):
    db = tmp_path / "h.duckdb"
    _run(db, "r1", "aaaaaaa1", {"src__a__8g__r1": 0.30, "src__b__8g__r2": -0.05})
    _run(db, "r2", "bbbbbbb2", {"src__a__8g__r1": 0.10, "src__b__8g__r2": -0.02})
    _run(db, "r3", "ccccccc3", {"src__a__8g__r1": 9.0}, status="running")  # never finished
    out = tmp_path / "dash"
    assert main(["dashboard", "--db", str(db), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "bbbbbbb2" in page and "2 complete run(s)" in page and "1 not complete" in page
    assert page.index("src__a__8g__r1") < page.index("src__b__8g__r2")  # worst first
    assert "+10.0 %" in page and "+900.0 %" not in page
    assert "<th>compute (s)</th>" in page  # the worst cases come with their breakdown
    for name in ("scatter", "errors", "trend"):
        assert (out / f"{name}_iteration_time_s.png").stat().st_size > 1000


def test_a_chosen_run_is_drawn_rather_than_a_later_one_of_fewer_cases(tmp_path, capsys):
    db, out = tmp_path / "h.duckdb", tmp_path / "dash"
    _run(db, "full", "aaaaaaa1", {"src__a__8g__r1": 0.30, "src__b__8g__r2": -0.05})
    _run(db, "one", "aaaaaaa1", {"src__a__8g__r1": 0.20})  # validate --select src__a__8g__r1
    _run(db, "cut", "aaaaaaa1", {}, status="interrupted")
    assert main(["dashboard", "--db", str(db), "--out", str(out), "--run", "full"]) == 0
    page = (out / "index.html").read_text()
    assert page.startswith("<!doctype") and "Run full at commit aaaaaaa1, 2 case(s);" in page
    assert "src__b__8g__r2" in page and "+30.0 %" in page
    assert main(["dashboard", "--db", str(db), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "Latest complete run one at commit aaaaaaa1, 1 case(s);" in page
    assert "src__b__8g__r2" not in page  # the trend's legend names only this run's worst cases
    capsys.readouterr()
    assert main(["dashboard", "--db", str(db), "--out", str(out), "--run", "cut"]) == 2
    assert "run_id='cut': that run is 'interrupted', not complete" in capsys.readouterr().err
    assert main(["dashboard", "--db", str(db), "--out", str(out), "--run", "nope"]) == 2
    assert "run_id='nope': no such run" in capsys.readouterr().err
    assert "Latest complete run one" in (out / "index.html").read_text()  # the page left as it was


def test_the_worst_cases_say_their_units_and_a_memory_table_has_no_time_parts(tmp_path):
    db = tmp_path / "h.duckdb"
    history.start_run(db, "r1", commit="aaaaaaa1", dirty=False, machine="m", settings={})
    case = CaseResult(baseline="src__a__8g__r1", source="src", gpu="h100-sxm-80g", world_size=8,
                      status="ok", wall_s=1.0,
                      metrics=[MetricResult("iteration_time_s", 1.5, 1.25),
                               MetricResult("peak_memory_reserved_bytes", 2.0 * 2**30, 2**31)])  # fmt: skip
    history.add_case(db, "r1", case)
    history.finish_run(db, "r1", "complete")
    out = tmp_path / "dash"
    assert main(["dashboard", "--db", str(db), "--out", str(out)]) == 0
    time_part, memory_part = (out / "index.html").read_text().split("<h2>")[1:]
    assert "1.5000 s" in time_part and "<th>compute (s)</th>" in time_part
    assert "2.00 GiB" in memory_part and "compute (s)" not in memory_part


def test_refuses_a_missing_or_empty_history(tmp_path, capsys):
    assert (
        main(["dashboard", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "d")])
        == 2
    )
    assert "no validation history" in capsys.readouterr().err
    db = tmp_path / "h.duckdb"
    _run(db, "r1", "a", {"x__y__1g__r1": 0.1}, status="running")
    assert main(["dashboard", "--db", str(db), "--out", str(tmp_path / "d")]) == 2
    assert "no complete validation run" in capsys.readouterr().err


def test_a_latest_run_that_scored_nothing_says_so(tmp_path):
    # a run of CPU recordings or failed emulations has no metric result: the page was blank
    db, out = tmp_path / "h.duckdb", tmp_path / "dash"
    _run(db, "r1", "aaaaaaa1", {}, status="running")
    history.add_case(db, "r1", CaseResult(baseline="src__a__8g__r1", source="src", gpu="h100-sxm-80g",
                                          world_size=8, status="failed", wall_s=1.0))  # fmt: skip
    history.finish_run(db, "r1", "complete")
    assert main(["dashboard", "--db", str(db), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "scored no case: of its 1 case(s), 1 failed to emulate" in page


def test_a_drawing_that_fails_leaves_no_partial_dashboard(tmp_path, monkeypatch, capsys):
    # the scatter was written before the histogram failed: a folder of one figure and no page
    import prismbench.dashboard

    db, out = tmp_path / "h.duckdb", tmp_path / "dash"
    _run(db, "r1", "aaaaaaa1", {"src__a__8g__r1": 0.30})

    def broken(*_args) -> None:
        raise ValueError("autodetected range of [nan, nan] is not finite")

    monkeypatch.setattr(prismbench.dashboard, "_histogram", broken)
    assert main(["dashboard", "--db", str(db), "--out", str(out)]) == 2
    assert "not finite" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.duckdb"]  # no staging folder left


@pytest.mark.slow
def test_every_image_loads_in_a_headless_browser(tmp_path):
    """Debian's chromium opens the page from disk (no server) and reports, through the page's
    title, how many of its images decoded with a size."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on this machine (Debian: apt install chromium)")
    db = tmp_path / "h.duckdb"
    _run(db, "r1", "aaaaaaa1", {"src__a__8g__r1": 0.30, "src__b__8g__r2": -0.05})
    out = tmp_path / "dash"
    assert main(["dashboard", "--db", str(db), "--out", str(out)]) == 0
    probe = out / "probe.html"
    probe.write_text(
        (out / "index.html")
        .read_text()
        .replace(
            "</body>",
            "<script>window.onload = () => { const imgs = [...document.images]; document.title = "
            "imgs.filter(i => i.complete && i.naturalWidth > 0).length + '/' + imgs.length; };"
            "</script></body>",
        )
    )
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
         "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    loaded, total = re.search(r"<title>(\d+)/(\d+)</title>", dom).groups()
    assert int(total) == 3 and loaded == total
