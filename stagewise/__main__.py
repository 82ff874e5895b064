"""``python -m stagewise``."""

from __future__ import annotations

import sys

from stagewise.cli.main import main

sys.exit(main())
