"""``python -m specheads`` is the ``specheads`` command."""

import sys

from specheads.cli import main

sys.exit(main())
