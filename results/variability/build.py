"""Build results/variability/<gpu>.json from the shared H100/H200 measurements.

    python results/variability/build.py [GPU_DIR ...]   (default: ../shared/data/gpu/*/)

Each GPU directory holds profiled iterations and repeated iteration times of the same jobs
(see its README); prismbench.variability_calibration says what is measured and how.
"""

import argparse
import sys
from datetime import date
from pathlib import Path

from prismbench.variability_calibration import (
    VARIABILITY_TABLES,
    calibrate_jobs,
    read_jobs,
    table_dict,
    write_table,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # results/: shared_gpu
from shared_gpu import ROOT, SHARED_GPU, commit_label  # noqa: E402


def main(gpu_dirs: list[Path]) -> None:
    commit = commit_label()
    for gpu_dir in gpu_dirs:
        jobs = read_jobs(gpu_dir)
        provenance = {
            "source": f"../shared/data/gpu/{gpu_dir.name}/ (profiles/, summary.json)",
            "jobs": [job.job for job in jobs],
            "built_by": "python results/variability/build.py",
            "commit": commit,
            "date": date.today().isoformat(),
        }
        path = write_table(
            table_dict(gpu_dir.name, calibrate_jobs(jobs), provenance),
            VARIABILITY_TABLES / f"{gpu_dir.name}.json",
        )
        print(f"wrote {path.relative_to(ROOT)} ({len(jobs)} jobs)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu_dirs", nargs="*", type=Path, metavar="GPU_DIR",
                        help="default: every ../shared/data/gpu/<gpu>/")  # fmt: skip
    main(parser.parse_args().gpu_dirs or sorted(SHARED_GPU.glob("*/")))
