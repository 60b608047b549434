"""`python -m rbprobes ...` (on a host) / `python -m rbprobes ...` (in the repo)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
