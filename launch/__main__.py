"""`python -m launch submit|script|sweep|preflight ...`: see launch/cli.py."""

import sys

from launch.cli import main

sys.exit(main())
