"""Run a trainer's entry with rank 0 arriving late: `python slow_rank0.py SECONDS MODULE ARGS...`.

Rank 0 sleeps before the trainer starts, as a rank whose imports took longer would, so every other
rank meets a config error first.
"""

import runpy
import sys
import time

from mcr.env import discover

delay, module = float(sys.argv[1]), sys.argv[2]
if discover().rank == 0:
    time.sleep(delay)
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
