"""`python -m apps.dlrm --config configs/dlrm/<preset>.yaml [key=value ...]` (under any launcher)."""

from apps.common.entry import run
from apps.dlrm.train import main

run(main, "dlrm")
