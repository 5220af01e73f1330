"""What every test of the suite runs under."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One torch thread per test process. The suite's real CPU runs train debug models, whose
    tensors are too small for threads to pay, and under pytest-xdist each worker's default
    (a thread per core) oversubscribes the cores: on CI's two, a parity reference took
    20-28 s on two threads and 0.07 s on one (tests/workloads/test_parallel_parity.py). The
    ranks `prismbench.launch.run_ranks` spawns set their own count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def capture_cache_of_the_session(tmp_path_factory):
    """Captures go to one folder per test process, not the user's ~/.cache/prismbench: tests
    that capture the same job share its capture (keyed by job and source, so the same
    trace), and the suite leaves nothing behind. A test that needs a cold cache (one that
    counts what a capture does, or checks the cache itself) sets PRISMBENCH_CACHE to its own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRISMBENCH_CACHE", str(tmp_path_factory.mktemp("prismbench-cache")))
        yield
