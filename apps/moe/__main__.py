"""`python -m apps.moe --config configs/moe/<preset>.yaml [key=value ...]` (under any launcher)."""

from apps.common.entry import run
from apps.moe.train import main

run(main, "moe")
