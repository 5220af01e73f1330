"""`python -m prismbench`: the same CLI as the `prismbench` console script."""

import sys

from prismbench.cli import main

sys.exit(main())
