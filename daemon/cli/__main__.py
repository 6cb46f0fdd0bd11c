"""``python -m salvor.daemon.cli``: the ``salvor`` command without its console script."""

import sys

from . import main

sys.exit(main())
