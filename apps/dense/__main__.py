"""`python -m apps.dense --config configs/dense/<preset>.yaml [key=value ...]` (under any launcher)."""

from apps.common.entry import run
from apps.dense.train import main

run(main, "dense")
