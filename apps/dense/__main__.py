"""`python -m apps.dense --config configs/dense/<preset>.yaml [key=value ...]` (under any launcher)."""

import sys

from apps.common.config import ConfigError
from apps.dense.train import main
from mcr.env import discover

try:
    main(sys.argv[1:])
except ConfigError as exc:
    if discover().rank == 0:  # every rank sees the same error; say it once
        print(f"apps.dense: config error: {exc}", file=sys.stderr)
    sys.exit(2)
