"""Token data for the language-model trainers: a synthetic stream (the default, for throughput
runs) or a text file through a byte-level tokenizer (no download), each with a held-out split.

Batches are a pure function of (seed, split, step, rank): a resumed run reads exactly the
batches the uninterrupted run would have, and every rank of the data-parallel world reads
its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from .schema import choice
from .seed import batch_generator


@dataclass
class DataConfig:
    kind: str = choice("synthetic", "text")
    path: Optional[str] = None  # text: a UTF-8 (or any) file, read as bytes
    val_fraction: float = 0.1  # text: the file's tail held out for validation
    branching: int = 4  # synthetic: successors per token, so the loss floor is log(branching)


class ByteTokenizer:
    """Bytes are tokens: vocabulary 256, nothing to download, lossless for any text."""

    vocab_size = 256

    @staticmethod
    def encode(text: str) -> torch.Tensor:
        return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)

    @staticmethod
    def decode(ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class TokenBatches:
    """`get(step, split)` -> (inputs, targets), each (batch, seq_len) int64."""

    def __init__(self, cfg: DataConfig, vocab_size: int, seq_len: int, batch: int, seed: int, rank: int):
        self.cfg, self.vocab_size, self.seq_len, self.batch = cfg, vocab_size, seq_len, batch
        self.seed, self.rank = seed, rank
        if cfg.kind == "text":
            with open(cfg.path, "rb") as f:
                data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
            cut = int(len(data) * (1 - cfg.val_fraction))
            self.splits = {"train": data[:cut], "val": data[cut:]}
            for name, part in self.splits.items():
                if len(part) <= seq_len + 1:
                    raise ValueError(
                        f"data.path {cfg.path}: the {name} split has {len(part)} bytes, "
                        f"fewer than model.seq_len + 2 = {seq_len + 2}; use a longer file or a shorter seq_len"
                    )
        else:
            # A fixed random sparse transition table: each token has `branching` equally likely
            # successors. The same table on every rank; train and val draw different walks.
            g = torch.Generator().manual_seed(seed)
            self.successors = torch.randint(0, vocab_size, (vocab_size, cfg.branching), generator=g)

    def get(self, step: int, split: str = "train"):
        g = batch_generator(self.seed, step, self.rank, split)
        n = self.seq_len + 1
        if self.cfg.kind == "text":
            data = self.splits[split]
            starts = torch.randint(0, len(data) - n, (self.batch,), generator=g)
            tokens = torch.stack([data[s : s + n] for s in starts.tolist()])
        else:
            tokens = torch.empty(self.batch, n, dtype=torch.long)
            tokens[:, 0] = torch.randint(0, self.vocab_size, (self.batch,), generator=g)
            picks = torch.randint(0, self.cfg.branching, (self.batch, n - 1), generator=g)
            for t in range(1, n):
                tokens[:, t] = self.successors[tokens[:, t - 1], picks[:, t - 1]]
        return tokens[:, :-1], tokens[:, 1:]


def check_data(cfg: DataConfig, vocab_size: int, key: str = "data") -> None:
    from .config import check

    if cfg.kind == "text":
        check(
            cfg.path is not None and os.path.isfile(cfg.path),
            f"{key}.path",
            f"data.kind=text needs an existing file, got {cfg.path!r}",
        )
        check(
            vocab_size >= ByteTokenizer.vocab_size,
            "model.vocab_size",
            f"the byte-level tokenizer needs at least 256, got {vocab_size}",
        )
        check(0 < cfg.val_fraction < 1, f"{key}.val_fraction", f"must be between 0 and 1, got {cfg.val_fraction}")
    else:
        check(cfg.branching >= 1, f"{key}.branching", f"must be >= 1, got {cfg.branching}")
