"""Criteo-shaped batches for the DLRM trainer: 13 dense features, 26 categorical features (one
KeyedJaggedTensor key per table), a click label; each batch a TorchRec `Batch`.

- `synthetic` (the throughput default): power-law ids, a hidden teacher makes the clicks
  learnable. A batch is a pure function of (seed, split, step, rank), so every rank reads its
  own and a resumed run reads exactly what the uninterrupted run would have.
- `criteo_tsv`: Criteo Kaggle `train.txt` or Terabyte `day_N` TSV files, streamed through
  TorchRec's `criteo_terabyte` pipe; rows are split into train and held-out by TorchRec's
  `rand_split_train_val`; ids are hashed (hex value modulo the table size).
- `criteo_npy`: the numpy form TorchRec's preprocessing writes (`day_{d}_{dense,sparse,labels}.npy`,
  `torchrec/datasets/scripts/npy_preproc_criteo.py`), read by `InMemoryBinaryCriteoIterDataPipe`;
  the last day is held out (its first half is TorchRec's "val" stage), the other days train.

Real data is checked before any process group starts (`check_data`): a missing, empty or
truncated file stops the run with a message naming the file and what is wrong with it.
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import re
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch
from torchrec.datasets.criteo import CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES, INT_FEATURE_COUNT
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from apps.common.config import ConfigError, check, choice
from apps.common.seed import batch_generator

TSV_COLUMNS = 1 + INT_FEATURE_COUNT + CAT_FEATURE_COUNT  # label, 13 ints, 26 hex categories


@dataclass
class DataConfig:
    kind: str = choice("synthetic", "criteo_tsv", "criteo_npy")
    path: Optional[str] = None  # criteo_tsv: a TSV file (or a glob); criteo_npy: the directory of day_*.npy
    val_fraction: float = 0.05  # criteo_tsv: rows held out for validation (TorchRec's rand_split_train_val)
    zipf: float = 1.1  # synthetic: id popularity ~ rank^-zipf (Criteo's ids are heavy-tailed)
    ids_per_feature: int = 1  # synthetic: up to this many ids per sample and feature (1: one-hot, as Criteo)


# --- synthetic ----------------------------------------------------------------------------------


def _coprime(salt: int, n: int) -> int:
    while math.gcd(salt, n) != 1:
        salt += 1
    return salt


class SyntheticCriteo:
    """`get(step, split)` -> Batch. Ids follow a power law, scattered over the table by a fixed
    bijection (so a row-wise shard holds hot and cold rows alike). Labels are drawn from a fixed
    teacher: a logistic model of the dense features and a per-id score, so AUC rises above 0.5
    as the embeddings learn the hot ids."""

    def __init__(self, cfg: DataConfig, num_embeddings: list, batch_size: int, seed: int, rank: int):
        self.cfg, self.num_embeddings, self.batch_size = cfg, list(num_embeddings), batch_size
        self.seed, self.rank = seed, rank
        g = torch.Generator().manual_seed(seed)
        self.dense_weight = torch.randn(INT_FEATURE_COUNT, generator=g) * 0.5
        self.scatter = [_coprime(int(torch.randint(1, 2**31 - 1, (1,), generator=g)), n) for n in num_embeddings]

    def _ids(self, n: int, rows: int, salt: int, g: torch.Generator) -> torch.Tensor:
        u = torch.rand(n, generator=g, dtype=torch.float64)
        # inverse-CDF draw from a continuous power law on [1, rows + 1): popular ids are small ranks
        a = 1.0 - self.cfg.zipf
        ranks = ((1.0 + u * ((rows + 1.0) ** a - 1.0)) ** (1.0 / a)).long().clamp(1, rows) - 1
        return (ranks * salt) % rows  # a fixed permutation of the rows: gcd(salt, rows) == 1

    def _score(self, ids: torch.Tensor, table: int) -> torch.Tensor:
        """A fixed pseudo-random score in [-1, 1) per (table, id), computed, not stored."""
        h = (ids * 2654435761 + (table + 1) * 40503 + self.seed) % 65521
        return h.double() / 32760.5 - 1.0

    def get(self, step: int, split: str = "train") -> Batch:
        g = batch_generator(self.seed, step, self.rank, split)
        b, k = self.batch_size, self.cfg.ids_per_feature
        dense = torch.randn(b, INT_FEATURE_COUNT, generator=g)
        lengths = torch.randint(1, k + 1, (CAT_FEATURE_COUNT, b), generator=g) if k > 1 else None
        values, logit = [], dense.double() @ self.dense_weight.double() - 1.0  # -1: about 30% clicks
        for t, rows in enumerate(self.num_embeddings):
            n = b if lengths is None else int(lengths[t].sum())
            ids = self._ids(n, rows, self.scatter[t], g)
            values.append(ids)
            scores = self._score(ids, t)
            if lengths is not None:
                scores = torch.segment_reduce(scores, "mean", lengths=lengths[t])
            logit += 0.6 * scores
        labels = (torch.rand(b, generator=g, dtype=torch.float64) < torch.sigmoid(logit)).float()
        kjt = KeyedJaggedTensor(
            keys=DEFAULT_CAT_NAMES,
            values=torch.cat(values),
            lengths=torch.ones(CAT_FEATURE_COUNT * b, dtype=torch.int32)
            if lengths is None
            else lengths.flatten().int(),
        )
        return Batch(dense_features=dense, sparse_features=kjt, labels=labels)

    def batches(self, split: str = "train", start: int = 0) -> Iterator[Batch]:
        """Batches for steps start+1, start+2, ... (endless)."""
        return (self.get(step, split) for step in itertools.count(start + 1))


# --- the real Criteo formats ----------------------------------------------------------------------


def _batch_from_arrays(dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Batch:
    b = len(dense)
    kjt = KeyedJaggedTensor(
        keys=DEFAULT_CAT_NAMES,
        values=torch.from_numpy(np.ascontiguousarray(sparse.T).reshape(-1)).long(),
        lengths=torch.ones(CAT_FEATURE_COUNT * b, dtype=torch.int32),
    )
    return Batch(
        dense_features=torch.from_numpy(np.asarray(dense, dtype=np.float32)),
        sparse_features=kjt,
        labels=torch.from_numpy(np.asarray(labels).reshape(-1).astype(np.float32)),
    )


class CriteoTsv:
    """Rows of the TSV files through TorchRec's `criteo_terabyte` pipe, batched; batch i goes to
    rank i % world. Dense values become log(1 + max(x, 0)); a category's hex id modulo its
    table's size is its row (an empty field is id 0)."""

    def __init__(self, cfg: DataConfig, num_embeddings: list, batch_size: int, seed: int, rank: int, world: int):
        from torchrec.datasets.criteo import criteo_terabyte
        from torchrec.datasets.utils import rand_split_train_val

        self.paths = tsv_paths(cfg.path)
        self.sizes = np.array(num_embeddings, dtype=np.int64)
        self.batch_size, self.rank, self.world = batch_size, rank, world
        rows = criteo_terabyte(self.paths, row_mapper=None)
        self.splits = dict(zip(("train", "val"), rand_split_train_val(rows, 1.0 - cfg.val_fraction, random_seed=seed)))

    def _to_batch(self, rows: list) -> Batch:
        table = np.array(rows, dtype=object)
        labels = np.array([int(v or 0) for v in table[:, 0]], dtype=np.float32)
        dense = np.array([[int(v or 0) for v in r] for r in table[:, 1 : 1 + INT_FEATURE_COUNT]], dtype=np.float64)
        sparse = np.array([[int(v or "0", 16) for v in r] for r in table[:, 1 + INT_FEATURE_COUNT :]], dtype=np.int64)
        return _batch_from_arrays(np.log1p(np.maximum(dense, 0)), sparse % self.sizes, labels)

    def _epoch(self, split: str) -> Iterator[Batch]:
        rows, index = [], 0
        for line, row in enumerate(self.splits[split]):
            if len(row) != TSV_COLUMNS:
                raise ValueError(f"{self.paths}: a row has {len(row)} fields, expected {TSV_COLUMNS} (row {line})")
            rows.append(row)
            if len(rows) == self.batch_size:
                if index % self.world == self.rank:
                    yield self._to_batch(rows)
                rows, index = [], index + 1
        # the last partial batch is dropped: every rank must take the same number of steps

    def batches(self, split: str = "train", start: int = 0) -> Iterator[Batch]:
        epochs = itertools.chain.from_iterable(self._epoch(split) for _ in itertools.count())
        return itertools.islice(epochs, start, None)


class CriteoNpy:
    """TorchRec's `InMemoryBinaryCriteoIterDataPipe` over `day_{d}_*.npy`: all days but the last
    train, the first half of the last day is the held-out split; ids are hashed modulo the table
    sizes by TorchRec (`hashes`)."""

    def __init__(self, cfg: DataConfig, num_embeddings: list, batch_size: int, seed: int, rank: int, world: int):
        self.days = npy_days(cfg.path)
        self.kw = dict(batch_size=batch_size, rank=rank, world_size=world, hashes=list(num_embeddings), drop_last=True)

    def _pipe(self, split: str):
        from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

        days = self.days[:-1] if split == "train" else self.days[-1:]
        paths = {part: [f"{d}_{part}.npy" for d in days] for part in ("dense", "sparse", "labels")}
        return InMemoryBinaryCriteoIterDataPipe(
            stage=split,
            dense_paths=paths["dense"],
            sparse_paths=paths["sparse"],
            labels_paths=paths["labels"],
            **self.kw,
        )

    def batches(self, split: str = "train", start: int = 0) -> Iterator[Batch]:
        pipe = self._pipe(split)
        if len(pipe) == 0:
            raise ValueError(f"data.path {os.path.dirname(self.days[0])}: too few {split} rows for one batch per rank")
        epochs = itertools.chain.from_iterable(pipe for _ in itertools.count())
        return itertools.islice(epochs, start, None)


def make_data(cfg: DataConfig, num_embeddings: list, batch_size: int, seed: int, rank: int, world: int):
    """The batch source `cfg.kind` names; `.batches(split, start)` iterates over its Batches."""
    if cfg.kind == "synthetic":
        return SyntheticCriteo(cfg, num_embeddings, batch_size, seed, rank)
    if cfg.kind == "criteo_tsv":
        return CriteoTsv(cfg, num_embeddings, batch_size, seed, rank, world)
    return CriteoNpy(cfg, num_embeddings, batch_size, seed, rank, world)


# --- checks before any process group ----------------------------------------------------------


def tsv_paths(path: str) -> list:
    return sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]


def npy_days(path: str) -> list:
    """The `<dir>/day_<d>` prefixes of the day files present, in day order."""
    days = {}
    for f in glob.glob(os.path.join(path, "day_*_dense.npy")):
        m = re.match(r"day_(\d+)_dense\.npy$", os.path.basename(f))
        if m:
            days[int(m.group(1))] = f[: -len("_dense.npy")]
    return [days[d] for d in sorted(days)]


def _check_file(path: str, key: str) -> int:
    if not os.path.isfile(path):
        raise ConfigError(f"bad value for config key {key!r}: no such file {path}")
    size = os.path.getsize(path)
    if size == 0:
        raise ConfigError(f"bad value for config key {key!r}: {path} is empty (0 bytes)")
    return size


def check_tsv_file(path: str, key: str = "data.path") -> None:
    """A whole Criteo TSV file ends with a newline, and its first and last rows have 40 fields."""
    size = _check_file(path, key)
    with open(path, "rb") as f:
        first = f.readline()
        f.seek(max(0, size - 65536))
        tail = f.read()
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    for name, line in (("first", first), ("last", last)):
        fields = line.rstrip(b"\r\n").count(b"\t") + 1
        if fields != TSV_COLUMNS:
            raise ConfigError(
                f"bad value for config key {key!r}: {path}: the {name} row has {fields} tab-separated fields, "
                f"a Criteo row has {TSV_COLUMNS} (label, {INT_FEATURE_COUNT} integers, {CAT_FEATURE_COUNT} categories)"
                + ("; the file looks truncated" if name == "last" else "")
            )
    if not tail.endswith(b"\n"):
        raise ConfigError(f"bad value for config key {key!r}: {path} is truncated: its last row has no line end")


def check_npy_file(path: str, columns: int, key: str = "data.path") -> int:
    """Header readable, 2-D with `columns` columns, and the file as long as the header says.
    Returns the number of rows."""
    size = _check_file(path, key)
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(f)
            header_end = f.tell()
    except (ValueError, OSError, EOFError) as exc:
        raise ConfigError(f"bad value for config key {key!r}: {path} is not a readable .npy file ({exc})") from None
    if len(shape) != 2 or shape[1] != columns:
        raise ConfigError(f"bad value for config key {key!r}: {path} holds shape {shape}, expected (rows, {columns})")
    expected = header_end + shape[0] * shape[1] * dtype.itemsize
    if size < expected:
        raise ConfigError(
            f"bad value for config key {key!r}: {path} is truncated: its header says {shape[0]} rows x {shape[1]} "
            f"{dtype} ({expected} bytes), the file has {size} bytes"
        )
    return int(shape[0])


def check_data(cfg: DataConfig, key: str = "data") -> None:
    check(cfg.ids_per_feature >= 1, f"{key}.ids_per_feature", f"must be >= 1, got {cfg.ids_per_feature}")
    check(cfg.zipf > 1.0, f"{key}.zipf", f"must be > 1 (a power law that can be normalised), got {cfg.zipf}")
    if cfg.kind == "synthetic":
        return
    check(cfg.path is not None, f"{key}.path", f"data.kind={cfg.kind} needs a path")
    if cfg.kind == "criteo_tsv":
        check(0 < cfg.val_fraction < 1, f"{key}.val_fraction", f"must be between 0 and 1, got {cfg.val_fraction}")
        paths = tsv_paths(cfg.path)
        check(bool(paths), f"{key}.path", f"no file matches {cfg.path}")
        for path in paths:
            check_tsv_file(path, f"{key}.path")
        return
    check(
        os.path.isdir(cfg.path), f"{key}.path", f"data.kind=criteo_npy needs a directory, no such directory {cfg.path}"
    )
    days = npy_days(cfg.path)
    check(
        len(days) >= 2,
        f"{key}.path",
        f"{cfg.path} holds {len(days)} day_<d>_dense.npy file(s); criteo_npy needs at least 2 days "
        "(the last is held out for validation)",
    )
    for day in days:
        rows = {
            part: check_npy_file(f"{day}_{part}.npy", cols, f"{key}.path")
            for part, cols in (("dense", INT_FEATURE_COUNT), ("sparse", CAT_FEATURE_COUNT), ("labels", 1))
        }
        check(
            len(set(rows.values())) == 1,
            f"{key}.path",
            f"{day}_*.npy disagree on the number of rows: {rows}",
        )
