"""``python -m fastrecover``: the same as the ``fastrecover`` console script."""

import sys

from fastrecover.cli import main

if __name__ == "__main__":
    sys.exit(main())
