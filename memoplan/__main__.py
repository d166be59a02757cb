"""``python -m memoplan``: the ``memoplan`` command."""

import sys

from memoplan.cli import main

sys.exit(main())
