"""Train the dense app (apps.dense) while recording every process group this rank makes.

    dense_groups.py RECORD_DIR [apps.dense arguments ...]

Every group creation passes through one of two calls: `torch.distributed.new_group` (DeepSpeed's
groups, through deepspeed.comm, and anyone else's torch groups) and the runtime's
`Runtime.new_group` (`mcr.new_group`, the runtime's world). Both are wrapped before the trainer
starts; each creation is recorded with its ranks and the code that asked for it (the first caller
outside torch, deepspeed.comm and mcr), and RECORD_DIR/rank<R>.json gets the list at the end.
"""

import json
import os
import sys
import traceback

import torch.distributed as dist

from mcr.runtime import Runtime

PLUMBING = (  # the layers a creation passes through on its way down: not who asked for it
    os.sep + os.path.join("torch", "distributed") + os.sep,
    os.sep + os.path.join("deepspeed", "comm") + os.sep,
    os.sep + "mcr" + os.sep,
    os.path.abspath(__file__),
)
created = []


def asker() -> str:
    """`path:line:function` of the first caller outside the plumbing (path from site-packages or the repo)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not any(part in frame.filename for part in PLUMBING):
            path = frame.filename.split("site-packages" + os.sep)[-1].replace(os.getcwd() + os.sep, "")
            return f"{path}:{frame.lineno}:{frame.name}"
    return "?"


def recorded(kind, make):
    def new_group(*args, **kwargs):
        group = make(*args, **kwargs)
        ranks = kwargs.get("ranks", args[-1] if args else None)
        ranks = sorted(int(r) for r in (range(dist.get_world_size()) if ranks is None else ranks))
        created.append({"kind": kind, "ranks": ranks, "by": asker()})
        return group

    return new_group


dist.new_group = recorded("torch", dist.new_group)
Runtime.new_group = recorded("mcr", Runtime.new_group)

from apps.dense.train import main  # noqa: E402  (after the wrapping: the trainer binds nothing early)

record_dir, argv = sys.argv[1], sys.argv[2:]
main(argv)
rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])  # the trainer shut torch down
os.makedirs(record_dir, exist_ok=True)
with open(os.path.join(record_dir, f"rank{rank}.json"), "w") as f:
    json.dump(created, f, indent=1)
