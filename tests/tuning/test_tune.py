"""`mcr.tools.tune` on 2 real ranks writes the same table on every rank, and the runtime follows it."""

import json
import os
import shutil

from mcr.tuning.table import TuningTable
from tests.ranks import run_ranks, run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
# small and quick: 3 ops, 16 B .. 2 MiB, a 512 KiB chunk candidate that applies from 1 MiB on
TUNE = [
    "-m",
    "mcr.tools.tune",
    "--ops",
    "all_reduce,all_to_all,send_recv",
    "--min-bytes",
    "16",
    "--max-bytes",
    "2M",
    "--chunks",
    "512K",
    "--iters",
    "6",
    "--warmup",
    "2",
    "--rounds",
    "2",
]


def test_tune_writes_an_identical_table_on_every_rank_and_the_runtime_follows_it(tmp_path):
    used = tmp_path / "comm_log.json"  # a model's comm log: it all-reduced 3000-byte messages
    used.write_text(json.dumps([{"op": "all_reduce", "backend": "mpi", "bytes": 3000, "group_size": 2, "count": 9}]))
    out = run_ranks(2, TUNE + ["--sizes-from", str(used), "--out", str(tmp_path / "table-{rank}.yaml")]).check().output
    t0, t1 = (tmp_path / "table-0.yaml").read_text(), (tmp_path / "table-1.yaml").read_text()
    assert t0 == t1, "ranks wrote different tables"

    table = TuningTable.load(str(tmp_path / "table-0.yaml"))
    fp = table.fingerprint
    assert fp["world_size"] == 2 and fp["ranks_per_node"] == 2 and {"mpi", "gloo"} <= set(fp["versions"])
    assert {c.op for c in table.curves} == {"all_reduce", "all_to_all", "send_recv"}
    for curve in table.curves:
        assert curve.bytes[0] == 16 and curve.bytes[-1] == 2 << 20
        assert (3000 in curve.bytes) == (curve.op == "all_reduce")  # the model's size, for its op only
        assert all(t > 0 for t in curve.latency_us["mpi"]) and all(t > 0 for t in curve.latency_us["gloo"])
    chunked = next(c for c in table.curves if c.op == "all_reduce").latency_us["mpi/chunk=512K"]
    assert chunked[-1] > 0 and chunked[0] is None  # measured only from two chunks up
    for e in table.entries:  # every choice keeps every candidate's latency beside it
        assert len(e.latency_us) >= 2 and e.latency_at_bytes is not None
    assert {m.candidate for m in table.model if m.op == "all_reduce"} >= {"mpi", "gloo", "mpi/chunk=512K"}
    assert (tmp_path / "table-0.md").exists() and (
        tmp_path / "table-0-plots" / "all_reduce-n2.png"
    ).stat().st_size > 10_000
    assert "# all_reduce, group of 2" in out
    assert "chunks 512K, back to back" in out, out[-3000:]  # one node: not paced unless asked

    # the table as measured: the runtime's choice at each entry's sizes is the entry's
    env = {"MCR_TUNING_FILE": str(tmp_path / "table-0.yaml")}
    changed = any(e.backend != "mpi" or e.chunk_bytes for e in table.entries if e.op == "all_reduce")
    followed = run_script(2, os.path.join(SCRIPTS, "follow_table.py"), int(changed), env=env).check().output
    assert followed.count("table followed") == 2, followed[-3000:]

    # the same table with every other all_reduce range moved off the built-in order's mpi
    for i, e in enumerate(e for e in table.entries if e.op == "all_reduce"):
        if i % 2 == 0:
            e.backend, e.chunk_bytes = ("gloo", 0) if e.backend == "mpi" and not e.chunk_bytes else ("mpi", 0)
    if all(e.backend == "mpi" and not e.chunk_bytes for e in table.entries if e.op == "all_reduce"):
        next(e for e in table.entries if e.op == "all_reduce").backend = "gloo"
    table.save(str(tmp_path / "edited.yaml"))
    env = {"MCR_TUNING_FILE": str(tmp_path / "edited.yaml")}
    followed = run_script(2, os.path.join(SCRIPTS, "follow_table.py"), 1, env=env).check().output
    assert followed.count("table followed") == 2, followed[-3000:]

    # a bfloat16 sweep of all_reduce added to (a copy of) the measured table, which it rewrites:
    # its entries beside the others
    bf16 = TUNE[:3] + ["all_reduce", "--max-bytes", "4K"] + TUNE[8:] + ["--dtype", "bfloat16", "--no-plots"]
    added = tmp_path / "added.yaml"
    shutil.copy(tmp_path / "table-0.yaml", added)
    run_ranks(2, bf16 + ["--add-to", str(added)]).check()
    merged, measured = TuningTable.load(str(added)), TuningTable.load(str(tmp_path / "table-0.yaml"))
    assert [(c.op, c.dtype) for c in merged.curves] == [(c.op, c.dtype) for c in measured.curves] + [
        ("all_reduce", "bfloat16")
    ]
    assert [e for e in merged.entries if e.dtype == "any"] == measured.entries
    assert {e.op for e in merged.entries if e.dtype == "bfloat16"} == {"all_reduce"}


def test_a_bfloat16_sweep_added_to_a_float32_table_decides_bfloat16_alone():
    from mcr.tools.tune import build_table
    from mcr.tuning.model import fits_for
    from mcr.tuning.rules import entries_for
    from mcr.tuning.table import Curve

    sizes = [2**k for k in range(4, 25)]
    order = {"all_reduce": ["mpi", "gloo"]}
    fp32 = Curve("all_reduce", 2, "float32", sizes, {"mpi": [2 + 1e-4 * s for s in sizes], "gloo": [3000.0] * 21})
    base = TuningTable({"world_size": 2}, entries_for(fp32), "base.yaml", [fp32], fits_for(fp32))
    # in bfloat16, gloo wins from 1 MiB up
    bf16 = Curve("all_reduce", 2, "bfloat16", sizes, {"mpi": [2 + 4e-4 * s for s in sizes], "gloo": [400.0] * 21})
    merged = build_table({"world_size": 2, "other": 1}, [bf16], 0.05, order, base)
    assert merged.fingerprint == base.fingerprint and merged.model == base.model
    assert [(c.dtype) for c in merged.curves] == ["float32", "bfloat16"]
    assert {e.dtype for e in merged.entries} == {"any", "bfloat16"}
    for nbytes in (16, 1 << 22):
        assert merged.lookup("all_reduce", nbytes, 2, "float32").backend == "mpi"
        assert merged.lookup("all_reduce", nbytes, 2, "float16").backend == "mpi"  # no float16 sweep: `any`
    assert merged.lookup("all_reduce", 16, 2, "bfloat16").backend == "mpi"
    assert merged.lookup("all_reduce", 1 << 22, 2, "bfloat16").backend == "gloo"
    # measuring bfloat16 again replaces the bfloat16 entries, not the float32 ones
    again = build_table({"world_size": 2}, [bf16], 0.05, order, merged)
    assert len(again.entries) == len(merged.entries) and len(again.curves) == 2


def test_tune_and_bench_refuse_device_cuda_without_a_gpu_before_any_rank_starts(capsys):
    import pytest
    import torch

    from mcr import api
    from mcr.tools import bench, tune

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for tool in (tune, bench):
        with pytest.raises(SystemExit) as stopped:
            tool.main(["--device", "cuda"])
        said = capsys.readouterr().err
        assert stopped.value.code == 2 and "--device cuda: " in said and "leave --device out" in said, said
    assert api._runtime is None  # stopped before mcr.init
