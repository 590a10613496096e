"""`python -m toolkit` is the same as the `toolkit` console script."""

import sys

from toolkit.cli import main

sys.exit(main())
