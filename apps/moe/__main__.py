"""`python -m apps.moe --config configs/moe/<preset>.yaml [key=value ...]` (under any launcher)."""

import sys

from apps.common.config import ConfigError
from apps.moe.train import main
from mcr.env import discover

try:
    main(sys.argv[1:])
except ConfigError as exc:
    if discover().rank == 0:  # every rank sees the same error; say it once
        print(f"apps.moe: config error: {exc}", file=sys.stderr)
    sys.exit(2)
