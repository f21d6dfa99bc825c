"""Run a trainer with a rank killed mid-save: `python fault.py [FAULT:]TAG MODULE ARGS...`.

FAULT says where checkpoint TAG's save is cut, by SIGKILL:

    mark     (the default) rank 0, about to point `latest` at TAG: every rank has written TAG's
             files, `latest` still names the previous checkpoint. A resume that took the newest
             directory instead of `latest` would start from TAG.
    rename   rank 0, inside the atomic write of `latest`: the temporary file holding TAG is written
             and synced, the rename over `latest` not yet done (a `.tmp-*` file is left behind).
    shard    rank 1, right after it wrote its first file of TAG (DeepSpeed's torch.save, or
             torch.distributed.checkpoint's stream): rank 0 still waits for it, nobody may mark TAG.

The peers are mid-save or mid-training, waiting for the killed rank, until the launcher ends
them. Each fault prints `fault at <time>: ...` first.
"""

import contextlib
import os
import runpy
import signal
import sys
import time

import apps.common.checkpoint as checkpoint

fault, _, tag = sys.argv[1].rpartition(":")
fault = fault or "mark"
module = sys.argv[2]
rank = int(
    next((os.environ[v] for v in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK") if v in os.environ), 0)
)


def die(what):
    print(f"fault at {time.time()}: rank {rank} SIGKILLed {what}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if fault == "mark":
    mark_latest = checkpoint.mark_latest

    def killed_before_marking(ckpt_dir, this_tag, keep=0):
        if this_tag == tag:
            die(f"before marking {tag} latest")
        mark_latest(ckpt_dir, this_tag, keep)

    checkpoint.mark_latest = killed_before_marking  # before the trainer imports it by name
elif fault == "rename":
    replace = os.replace

    def killed_before_the_rename(src, dst, *args, **kwargs):
        if os.path.basename(dst) == checkpoint.LATEST:
            with open(src) as f:
                if f.read() == tag:
                    die(f"inside the atomic write of latest = {tag}, before the rename ({os.path.basename(src)})")
        return replace(src, dst, *args, **kwargs)

    os.replace = killed_before_the_rename  # write_atomic calls os.replace at call time
elif fault == "shard" and rank == 1:
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystem

    def after_first_file_of_tag(path):
        path = str(path)
        if os.sep + tag + os.sep in path:
            die(f"after writing its first file of {tag}: {path}")

    save = torch.save

    def save_then_maybe_die(obj, f, *args, **kwargs):
        save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)):
            after_first_file_of_tag(f)

    torch.save = save_then_maybe_die  # DeepSpeed's checkpoint engine calls torch.save at call time
    create_stream = FileSystem.create_stream

    @contextlib.contextmanager
    def stream_then_maybe_die(self, path, mode):
        with create_stream(self, path, mode) as stream:
            yield stream
        if "w" in mode:  # closed: the file is whole on disk
            after_first_file_of_tag(path)

    FileSystem.create_stream = stream_then_maybe_die  # torch.distributed.checkpoint's writer (dlrm)
elif fault != "shard":  # shard on rank 0: nothing to cut
    raise SystemExit(f"fault.py: unknown fault {fault!r}; choose mark, rename or shard")
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
