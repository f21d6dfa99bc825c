"""The DLRM trainer's data: synthetic batches, the Criteo TSV and numpy formats through TorchRec's
readers (on small files written here in those formats), and the checks on bad files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apps.common.config import ConfigError
from apps.dlrm.data import DataConfig, check_data, make_data

SIZES = [50 + 7 * i for i in range(26)]  # distinct table sizes, so a wrong table's modulus shows


def dense_of(batch):
    return batch.dense_features


def ids_of(batch):
    """(batch, 26) ids, one per sample and feature (one-hot data)."""
    kjt = batch.sparse_features
    assert torch.equal(kjt.lengths(), torch.ones_like(kjt.lengths()))
    return kjt.values().view(26, -1).T


# --- synthetic ---------------------------------------------------------------------------------


def test_synthetic_batches_are_a_function_of_seed_split_step_and_rank():
    def batch(rank=0, step=1, split="train", seed=3):
        return make_data(DataConfig(), SIZES, 64, seed, rank, 2).get(step, split)

    a = batch()
    assert a.dense_features.shape == (64, 13) and a.labels.shape == (64,)
    for same in (batch(), make_data(DataConfig(), SIZES, 64, 3, 0, 2).batches("train", 0).__next__()):
        assert torch.equal(dense_of(a), dense_of(same)) and torch.equal(ids_of(a), ids_of(same))
        assert torch.equal(a.labels, same.labels)
    for other in (batch(rank=1), batch(step=2), batch(split="val"), batch(seed=4)):
        assert not torch.equal(dense_of(a), dense_of(other))
        assert not torch.equal(ids_of(a), ids_of(other))
    ids = ids_of(a)
    assert (ids >= 0).all() and (ids < torch.tensor(SIZES)).all()


def test_synthetic_ids_are_heavy_tailed_and_clicks_depend_on_them():
    data = make_data(DataConfig(zipf=1.2), [10_000] * 26, 4096, 0, 0, 1)
    batch = data.get(1)
    ids = ids_of(batch)[:, 0]
    counts = torch.bincount(ids, minlength=10_000).sort(descending=True).values
    assert counts[:100].sum() > 0.3 * len(ids)  # 1% of the rows take a third of the lookups
    assert 0.1 < batch.labels.mean() < 0.6
    # the hidden teacher: samples whose table-0 id scores high click more often than those scoring low
    scores = data._score(ids, 0)
    hi, lo = batch.labels[scores > 0.5].mean(), batch.labels[scores < -0.5].mean()
    assert hi > lo + 0.05, (hi, lo)


def test_synthetic_multi_hot_has_one_to_k_ids_per_feature():
    batch = make_data(DataConfig(ids_per_feature=3), SIZES, 32, 0, 0, 1).get(1)
    lengths = batch.sparse_features.lengths()
    assert lengths.min() >= 1 and lengths.max() == 3 and len(lengths) == 26 * 32


# --- Criteo TSV --------------------------------------------------------------------------------


def tsv_row(i: int) -> list:
    """Row i: its index in int_0 (so a batch tells which rows it holds), an empty and a negative
    integer, an empty category, hex ids of several sizes."""
    ints = [str(i), "" if i % 3 == 0 else str(i * 5), "-1"] + [str(i + j) for j in range(3, 13)]
    cats = ["" if j == 4 else format(i * 7919 + j * 104729 + 2**33 * (j % 2), "x") for j in range(26)]
    return [str(i % 2), *ints, *cats]


def expected_tsv(i: int):
    row = tsv_row(i)
    dense = [math.log1p(max(int(v or 0), 0)) for v in row[1:14]]
    ids = [int(v or "0", 16) % SIZES[j] for j, v in enumerate(row[14:])]
    return float(row[0]), torch.tensor(dense), torch.tensor(ids)


def write_tsv(path, rows: int, cut: int = 0):
    text = "".join("\t".join(tsv_row(i)) + "\n" for i in range(rows))
    path.write_text(text[: len(text) - cut] if cut else text)
    return path


def test_criteo_tsv_batches_hold_the_written_rows_split_by_rank_and_held_out(tmp_path):
    path = write_tsv(tmp_path / "day_0", 120)
    cfg = DataConfig(kind="criteo_tsv", path=str(path), val_fraction=0.25)
    check_data(cfg)
    seen = {}
    for split in ("train", "val"):
        for rank in (0, 1):
            it = make_data(cfg, SIZES, 4, 7, rank, 2).batches(split)
            for batch in [next(it) for _ in range(3)]:
                rows = torch.expm1(batch.dense_features[:, 0]).round().long().tolist()
                for k, i in enumerate(rows):
                    label, dense, ids = expected_tsv(i)
                    assert batch.labels[k].item() == label
                    torch.testing.assert_close(batch.dense_features[k], dense)
                    assert torch.equal(ids_of(batch)[k], ids), i
                seen.setdefault((split, rank), []).extend(rows)
    for key, rows in seen.items():
        assert rows == sorted(rows) and len(set(rows)) == len(rows) == 12, (key, rows)  # file order, no repeats
    for split in ("train", "val"):
        assert not set(seen[(split, 0)]) & set(seen[(split, 1)])  # each rank its own batches
    train = set(seen[("train", 0)] + seen[("train", 1)])
    assert not train & set(seen[("val", 0)] + seen[("val", 1)])  # the held-out rows are never trained on


# --- Criteo numpy (TorchRec's preprocessed form) -------------------------------------------------


def write_npy_day(directory, day: int, rows: int, truncate: int = 0):
    """day_<d>_{dense,sparse,labels}.npy as TorchRec's tsv_to_npys writes them: float32 dense,
    int64 (later contiguous int32) sparse, int32 labels of shape (rows, 1); row i of day d
    holds 1000 * d + i in dense column 0 so a batch tells which rows it holds."""
    idx = np.arange(rows) + 1000 * day
    dense = np.stack([idx + j for j in range(13)], axis=1).astype(np.float32)
    sparse = np.stack([idx * 31 + j * 1000 for j in range(26)], axis=1).astype(np.int32)
    labels = (idx % 3 == 0).astype(np.int32).reshape(-1, 1)
    for part, arr in (("dense", dense), ("sparse", sparse), ("labels", labels)):
        path = directory / f"day_{day}_{part}.npy"
        np.save(path, arr)
        if truncate and part == "sparse":
            path.write_bytes(path.read_bytes()[:-truncate])


def test_criteo_npy_batches_follow_torchrecs_reader_per_rank_and_hold_out_the_last_day(tmp_path):
    for day in (0, 1):
        write_npy_day(tmp_path, day, 40)
    cfg = DataConfig(kind="criteo_npy", path=str(tmp_path))
    check_data(cfg)
    for rank in (0, 1):
        data = make_data(cfg, SIZES, 4, 0, rank, 2)
        train, val = data.batches("train"), data.batches("val")
        for n in range(3):  # batch k of the day goes to rank k % 2
            batch, first = next(train), (2 * n + rank) * 4
            rows = np.arange(first, first + 4)
            assert batch.dense_features[:, 0].tolist() == rows.tolist()
            expected = (rows[:, None] * 31 + np.arange(26)[None, :] * 1000) % np.array(SIZES)[None, :]
            assert torch.equal(ids_of(batch), torch.from_numpy(expected).long())
            assert batch.labels.tolist() == (rows % 3 == 0).astype(np.float32).tolist()
        held_out = next(val)  # day 1, its first half (TorchRec's "val" stage)
        assert held_out.dense_features[:, 0].tolist() == list(range(1000 + 4 * rank, 1004 + 4 * rank))


# --- bad files --------------------------------------------------------------------------------


def test_missing_empty_and_truncated_tsv_files_are_named_with_the_fault(tmp_path):
    cases = {
        "no such file": tmp_path / "missing.tsv",
        "is empty": tmp_path / "empty.tsv",
        "truncated": write_tsv(tmp_path / "cut.tsv", 10, cut=25),  # cut inside the last row
        "the first row has 3": tmp_path / "not_criteo.tsv",
    }
    cases["is empty"].write_text("")
    cases["the first row has 3"].write_text("a\tb\tc\n")
    for fault, path in cases.items():
        with pytest.raises(ConfigError) as err:
            check_data(DataConfig(kind="criteo_tsv", path=str(path)))
        assert str(path) in str(err.value) and fault in str(err.value), err.value


def test_missing_empty_and_truncated_npy_files_are_named_with_the_fault(tmp_path):
    write_npy_day(tmp_path, 0, 20)
    write_npy_day(tmp_path, 1, 20, truncate=9)
    with pytest.raises(ConfigError, match=r"day_1_sparse.npy is truncated: its header says 20 rows x 26"):
        check_data(DataConfig(kind="criteo_npy", path=str(tmp_path)))
    write_npy_day(tmp_path, 1, 20)
    (tmp_path / "day_1_labels.npy").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"day_1_labels.npy is empty"):
        check_data(DataConfig(kind="criteo_npy", path=str(tmp_path)))
    (tmp_path / "day_1_labels.npy").unlink()
    with pytest.raises(ConfigError, match=r"no such file .*day_1_labels.npy"):
        check_data(DataConfig(kind="criteo_npy", path=str(tmp_path)))
    (tmp_path / "one_day").mkdir()
    write_npy_day(tmp_path / "one_day", 0, 20)
    with pytest.raises(ConfigError, match=r"holds 1 day_<d>_dense.npy file\(s\); criteo_npy needs at least 2 days"):
        check_data(DataConfig(kind="criteo_npy", path=str(tmp_path / "one_day")))
