"""Run a trainer with a rank killed mid-save: `python fault_script.py TAG MODULE ARGS...`.

Rank 0 is SIGKILLed when it is about to point `latest` at checkpoint TAG: every rank has written
TAG's files, `latest` still names the previous checkpoint. A resume that took the newest
directory instead of `latest` would start from TAG. The peers are mid-training, waiting for
rank 0 in the next step's collectives, until the launcher ends them.
"""

import os
import runpy
import signal
import sys
import time

import apps.common.checkpoint as checkpoint

tag, module = sys.argv[1], sys.argv[2]
mark_latest = checkpoint.mark_latest


def killed_before_marking(ckpt_dir, this_tag, keep=0):
    if this_tag == tag:
        print(f"fault at {time.time()}: rank 0 SIGKILLed before marking {tag} latest", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    mark_latest(ckpt_dir, this_tag, keep)


checkpoint.mark_latest = killed_before_marking  # before the trainer imports it by name
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
