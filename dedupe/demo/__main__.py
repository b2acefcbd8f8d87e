"""``python -m dedupe.demo``: see :func:`dedupe.demo.main`."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
