"""What a speed table says of its machine (results/perf/machine.py)."""

import re

from tests.results.conftest import load_script

machine = load_script("perf/machine.py")


def test_the_yardstick_is_a_time_and_a_smaller_loop_takes_less(monkeypatch):
    full = machine.yardstick_s(repeats=1)
    monkeypatch.setattr(machine, "YARDSTICK_ADDITIONS", machine.YARDSTICK_ADDITIONS // 100)
    assert 0 < machine.yardstick_s(repeats=1) < full


def test_the_line_names_the_cpu_cores_versions_and_yardstick(monkeypatch):
    monkeypatch.setattr(machine, "yardstick_s", lambda: 0.6)
    line = machine.machine_line()
    assert line.startswith(f"Machine: {machine.cpu_model()} (")
    assert f"{machine.usable_cores()} cores" in line
    assert re.search(r"Python 3\.\d+\.\d+", line)
    assert "1e+07 pure-Python additions in 0.60 s (best of 3" in line
