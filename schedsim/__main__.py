"""``python -m schedsim``: the ``schedsim`` command, for environments where the installed
script is not on PATH (a ``--target`` install, a copied tree)."""

import sys

from schedsim.cli.main import main

sys.exit(main())
