"""``python -m tests.chaos``: see :mod:`tests.chaos.run`."""

import sys

from .run import main

# The producers are spawned: each child imports this module again, as __mp_main__.
if __name__ == "__main__":
    sys.exit(main())
