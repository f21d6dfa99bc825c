"""Checkpoint bookkeeping shared by the trainers.

A checkpoint directory holds one sub-directory per tag (`step_000100`) and a `latest` file
naming the newest complete one. The framework (DeepSpeed, torch.save, ...) writes a tag's
files; only after every rank has finished does rank 0 point `latest` at it, by an atomic
rename, so a job killed mid-save resumes from the previous complete checkpoint. DeepSpeed's
`load_checkpoint(dir)` reads the same `latest` file.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Optional

from .config import write_atomic


@dataclass
class CheckpointConfig:
    enabled: bool = True
    interval: int = 0  # save every N steps (0: only at the end)
    keep: int = 2  # keep the newest N checkpoints (0: all)


LATEST = "latest"
_TAG = re.compile(r"^step_(\d+)$")


def tag_for(step: int) -> str:
    return f"step_{step:06d}"


def step_of(tag: str) -> int:
    m = _TAG.match(tag)
    if m is None:
        raise ValueError(f"checkpoint tag {tag!r} is not of the form step_NNNNNN")
    return int(m.group(1))


def latest_tag(ckpt_dir: str) -> Optional[str]:
    """The newest complete checkpoint's tag, or None when there is none."""
    path = os.path.join(ckpt_dir, LATEST)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        tag = f.read().strip()
    return tag if tag and os.path.isdir(os.path.join(ckpt_dir, tag)) else None


def mark_latest(ckpt_dir: str, tag: str, keep: int = 0) -> None:
    """Point `latest` at `tag` (call on one rank, after all ranks finished writing `tag`), then
    delete all but the newest `keep` checkpoints (0: keep all)."""
    write_atomic(os.path.join(ckpt_dir, LATEST), tag)
    if keep > 0:
        tags = sorted((t for t in os.listdir(ckpt_dir) if _TAG.match(t)), key=step_of)
        for old in tags[:-keep]:
            if old != tag:
                shutil.rmtree(os.path.join(ckpt_dir, old), ignore_errors=True)
