"""`python -m bench.peers PEER COMMAND ...`: see bench/peers/_cli.py."""

from __future__ import annotations

import sys

from bench.peers import _cli

_cli.main(sys.argv[1:])
