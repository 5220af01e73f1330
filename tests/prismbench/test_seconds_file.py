"""Measured durations read one per line (prismbench.seconds_file), for any measurement."""

import pytest

from prismbench.seconds_file import read_seconds
from workloads.config import SpecError

TRANSFERS = dict(option="--pipeline-transfers", item="transfer", each="one send/recv's duration")


def test_the_durations_come_back_in_order_without_the_comments(tmp_path):
    path = tmp_path / "sendrecv_s.txt"
    path.write_text("# NCCL SendRecv, stage 0\n2e-3\n\n  2.5e-3  \n# stage 1\n0.02\n")
    assert read_seconds(path, minimum=3, **TRANSFERS).tolist() == [2e-3, 2.5e-3, 0.02]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("2e-3\n2 ms\n", "line 2: '2 ms' is not a number: give one send/recv's duration"),
        ("2e-3\n-1e-3\n", "line 2: '-1e-3': a time in seconds must be > 0"),
        ("2e-3\ninf\n", "line 2: 'inf': a time in seconds must be > 0"),
        ("2e-3\n# 1e-3\n", "1 transfer(s); give at least 2 (one send/recv's duration in seconds"),
    ],
)
def test_a_bad_line_or_too_few_are_refused_naming_the_option_and_file(tmp_path, text, needle):
    path = tmp_path / "sendrecv_s.txt"
    path.write_text(text)
    with pytest.raises(SpecError, match="^--pipeline-transfers .*sendrecv_s.txt") as err:
        read_seconds(path, minimum=2, **TRANSFERS)
    assert needle in str(err.value)
