"""``python -m moestab`` (and ``torchrun ... -m moestab train``): the ``moestab`` console script."""

import sys

from moestab.cli import main

sys.exit(main())
