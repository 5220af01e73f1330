"""Regenerate the goldens: `python -m tests.goldens.make [NAME ...]` (default: all).

Only for a commit that means to change predictions; say in its message what moved and why.
"""

import os
import sys
import tempfile

from tests.goldens.jobs import GOLDEN_JOBS
from tests.goldens.record import record, save

if __name__ == "__main__":
    names = sys.argv[1:] or list(GOLDEN_JOBS)
    os.environ["PRISMBENCH_CACHE"] = tempfile.mkdtemp(prefix="prismbench-goldens-")
    for name in names:
        path = save(name, record(GOLDEN_JOBS[name], name))
        print(f"{name}: {path} ({path.stat().st_size / 1024:.0f} KiB)")
