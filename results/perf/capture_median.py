"""Median of three cold captures of the Llama 3.1 405B job (capture_bench.py's), for
comparing two commits on one machine: `python results/perf/capture_median.py` at each.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from capture_bench import llama3_405b

    from prismbench.capture import capture_job

    times = []
    for i in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            capture_job(llama3_405b(), cache_dir=Path(tmp), use_cache=False)
            times.append(time.perf_counter() - t0)
        print(f"run {i}: {times[-1]:.1f} s", flush=True)
    print(f"median {statistics.median(times):.1f} s of {[round(t, 1) for t in times]}")


if __name__ == "__main__":
    main()
