"""The seeds every trainer derives from `train.seed`, defined once.

Both are pure functions of (seed, step, rank[, split]), so a resumed run draws exactly the
numbers the uninterrupted run would have, and every rank draws its own.
"""

from __future__ import annotations

import torch

SPLITS = ("train", "val")


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed for one training step on one rank (dropout, random token selection, ...)."""
    return seed * 1_000_003 + step * 4099 + rank


def seed_step(seed: int, step: int, rank: int) -> None:
    """Reseed torch's global generator for this step: call at the top of every step."""
    torch.manual_seed(step_seed(seed, step, rank))


def batch_generator(seed: int, step: int, rank: int, split: str = "train") -> torch.Generator:
    """A private generator for one batch: the data never shares the model's random stream."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 4099 + rank) * 2 + SPLITS.index(split))
