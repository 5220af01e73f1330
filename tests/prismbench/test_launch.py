"""prismbench.launch on real spawned gloo processes: a rank that dies without reporting fails
the run with its exit code (a signal shows as a negative one). The parity tests show results
coming back in rank order."""

import os
import signal

import pytest
import torch.distributed as dist

from prismbench.launch import RanksDied, run_ranks


def die_on_rank_one(how: str) -> None:
    if dist.get_rank() == 1:
        if how == "signal":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0 if how == "success" else 3)


@pytest.mark.parametrize(
    ("how", "code"), [("signal", -signal.SIGKILL), ("exit", 3), ("success", 0)]
)
def test_a_rank_that_dies_is_named_with_its_exit_code(how, code):
    # status 0 without a result too: it was left to the timeout (60 s here)
    with pytest.raises(RanksDied) as died:
        run_ranks(2, die_on_rank_one, how, timeout_s=60)
    assert died.value.exit_codes == {1: code}
    assert died.value.by_signal is (code < 0)
