"""`python -m apps.dlrm --config configs/dlrm/<preset>.yaml [key=value ...]` (under any launcher)."""

import sys

from apps.common.config import ConfigError
from apps.dlrm.train import main
from mcr.env import discover

try:
    main(sys.argv[1:])
except ConfigError as exc:
    if discover().rank == 0:  # every rank sees the same error; say it once
        print(f"apps.dlrm: config error: {exc}", file=sys.stderr)
    sys.exit(2)
