"""`python -m forklift` is the `forklift` command."""

from __future__ import annotations

import sys

from forklift.cli import main

sys.exit(main())
