"""The DLRM trainer on real ranks: sharded losses against an unsharded model, every sharding
type on every backend through `python -m apps.dlrm.compare`, checkpoint and resume, and the
settings that must fail with their messages.

Each 2-rank launch runs the real entry point (`python -m apps.dlrm` under mpiexec) on the tiny
preset; the runs are shared by the tests through module fixtures, so the file costs six launches
(three of them the compare's).
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from apps.common.config import ConfigError, load_config
from apps.common.metrics import read_jsonl
from apps.dlrm.config import DLRMConfig
from tests.apps.test_dlrm_data import write_npy_day
from tests.ranks import REPO, run_ranks, run_tool

TINY = os.path.join(REPO, "configs", "dlrm", "tiny.yaml")
STEPS = 6
# TW, RW and TWRW keep whole rows in one place, so the row-wise Adagrad sees the same rows as
# the unsharded model: the sharded run must follow the unsharded one. The other tables are
# left to the planner (on CPU it picks table-wise or data-parallel... pinned here to TW).
EXACT_TYPES = {f"t_cat_{i}": ("table_wise", "row_wise", "table_row_wise")[i % 3] for i in range(26)}
# every type at once: column-wise and data-parallel change the update (per-column-shard row
# statistics; replicated tables' gradients averaged, not summed), so these only have to train
ALL_TYPES = {
    f"t_cat_{i}": ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")[i % 5] for i in range(26)
}
# fp32 on both sides, summed in a different order (all-to-all vs one lookup): measured 1e-5 after 6 steps
LOSS_RTOL = 5e-5


def types_override(types: dict) -> str:
    return "sharding.types={" + ",".join(f"{t}: {k}" for t, k in types.items()) + "}"


def launch(tmp_path, name, *overrides, nprocs=2, launcher="mpiexec"):
    out = run_ranks(
        nprocs,
        ["-m", "apps.dlrm", "--config", TINY, f"out_dir={tmp_path}", f"name={name}", *overrides],
        launcher=launcher,
        timeout=600,
    ).check()
    run_dir = tmp_path / name
    with open(run_dir / "sharding_plan.json") as f:
        plan = json.load(f)
    return out.output, read_jsonl(run_dir / "metrics.jsonl"), plan


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Launch A: TW/RW/TWRW uninterrupted, evaluating every 2 steps (the pipeline detaches for the
    held-out batches and must go on with the batch it had prefetched). Launches B and C: the same
    run stopped after 3 steps with a checkpoint, then resumed under torchrun (no MPI world: every
    collective on gloo)."""
    tmp = tmp_path_factory.mktemp("dlrm")
    exact = types_override(EXACT_TYPES)
    return {
        "exact": launch(tmp, "exact", exact, f"train.steps={STEPS}", "eval_interval=2"),
        "first": launch(tmp, "resumed", exact, f"train.steps={STEPS}", "train.stop_after=3", "checkpoint.enabled=true"),
        "second": launch(
            tmp, "resumed", exact, f"train.steps={STEPS}", "resume=true", "checkpoint.enabled=true", launcher="torchrun"
        ),
    }


# --- the unsharded reference ---------------------------------------------------------------------


def unsharded_losses(overrides: list, world: int, steps: int) -> list:
    """One process, no process group: the same DLRM with every table whole, the same initial
    weights (init_tables) and the same batches (every rank's, for each step). TorchRec sums the
    tables' gradients over the ranks (the pooled-embedding all-to-all's backward) and DDP
    averages the dense ones, so: backward of the sum of the ranks' mean losses, dense gradients
    divided by the world size."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from apps.dlrm.data import make_data
    from apps.dlrm.model import build_model, init_tables, table_rows

    cfg = load_config(DLRMConfig, ["--config", TINY, *overrides])
    t = cfg.train
    torch.manual_seed(t.seed)
    model = build_model(cfg.model, torch.device("cpu"))
    ebc = model.model.sparse_arch.embedding_bag_collection
    ebc.to_empty(device=torch.device("cpu"))
    init_tables(model, cfg.model, t.seed)
    tables = list(ebc.parameters())
    dense = [p for p in model.parameters() if all(p is not q for q in tables)]
    sparse_opt = RowWiseAdagrad(tables, lr=t.embedding_lr, eps=t.eps)
    dense_opt = torch.optim.Adagrad(dense, lr=t.lr, eps=t.eps)
    data = [make_data(cfg.data, table_rows(cfg.model), t.batch_size, t.seed, r, world) for r in range(world)]
    losses = []
    for step in range(1, steps + 1):
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        per_rank = [model(d.get(step))[0] for d in data]
        sum(per_rank).backward()
        for p in dense:
            p.grad /= world
        sparse_opt.step()
        dense_opt.step()
        losses.append(sum(x.item() for x in per_rank) / world)
    return losses


def losses_of(records):
    return [r["loss"] for r in records]


def test_sharded_losses_match_an_unsharded_model_for_table_and_row_wise(runs):
    _, records, plan = runs["exact"]
    assert {p["sharding_type"] for p in plan.values()} == {"table_wise", "row_wise", "table_row_wise"}
    assert all(plan[t]["sharding_type"] == k for t, k in EXACT_TYPES.items()), plan
    expected = unsharded_losses([f"train.steps={STEPS}"], world=2, steps=STEPS)
    got = losses_of(records)
    assert len(got) == STEPS
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=LOSS_RTOL, atol=0)
    assert got[-1] < got[0], got  # and it learns
    assert [r["step"] for r in records if "auc" in r] == [2, 4, 6]  # evaluated mid-run, training undisturbed
    assert 0.5 < records[-1]["auc"] <= 1.0, records[-1]


COMPARE_STEPS = 8


def test_compare_trains_every_sharding_type_on_each_backend_and_tabulates_them(tmp_path):
    """`python -m apps.dlrm.compare` on the tiny preset with all five sharding types at once, on
    DLRM_DCN, reading Criteo's numpy form (files written here) through TorchRec's reader: gloo
    only, MPI only and the runtime's choice each train, with the same losses, and the table
    shows each job's samples/s."""
    npy = tmp_path / "criteo_npy"
    npy.mkdir()
    write_npy_day(npy, 0, 256)
    write_npy_day(npy, 1, 128)
    out = tmp_path / "runs"
    args = ["--config", TINY, f"--out={out}", types_override(ALL_TYPES), f"train.steps={COMPARE_STEPS}"]
    args += ["model.interaction=dcn", "data.kind=criteo_npy", f"data.path={npy}"]
    stdout = run_tool("apps.dlrm.compare", *args, timeout=900).check().output
    table = stdout[stdout.index("DLRM (TorchRec) throughput: tiny.yaml, 2 ranks") :].splitlines()
    assert table[1].split() == "backend samples/s step ms compute comm p10 samples/s vs gloo vs mpi".split()
    assert (out / "compare-dlrm.txt").read_text().strip() == "\n".join(table).strip()
    losses = {}
    for choice in ("gloo", "mpi", "auto"):
        run_dir = out / f"compare-dlrm-{choice}-r0"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["comm_backend"], summary["steps"]) == (choice, COMPARE_STEPS)
        assert (summary["model"], summary["data"]) == ("DLRM_DCN", "criteo_npy")
        row = next(line for line in table if line.startswith(choice)).split()
        assert row[1] == f"{summary['samples_per_s']:,.1f}", (row, summary)
        plan = json.loads((run_dir / "sharding_plan.json").read_text())
        assert {t: p["sharding_type"] for t, p in plan.items()} == ALL_TYPES
        # TorchRec's collectives ran on mcr, on the backend the row names (auto: MPI first on CPU)
        comm = {(r["op"], r["backend"]) for r in json.loads((run_dir / "comm_log.json").read_text())}
        backend = "gloo" if choice == "gloo" else "mpi"
        assert {("all_to_all", backend), ("reduce_scatter", backend), ("all_reduce", backend)} <= comm, comm
        losses[choice] = losses_of(read_jsonl(run_dir / "metrics.jsonl"))
    assert len(losses["gloo"]) == COMPARE_STEPS and all(torch.isfinite(torch.tensor(losses["gloo"])))
    assert sum(losses["gloo"][-3:]) < sum(losses["gloo"][:3]), losses
    for choice in ("mpi", "auto"):  # the backend moves the same bytes: the same training
        torch.testing.assert_close(torch.tensor(losses[choice]), torch.tensor(losses["gloo"]), rtol=LOSS_RTOL, atol=0)


def test_resume_under_torchrun_continues_the_uninterrupted_loss_curve(runs):
    _, uninterrupted, _ = runs["exact"]
    out_first, first, _ = runs["first"]
    out_second, second, _ = runs["second"]
    assert [r["step"] for r in first] == [1, 2, 3]
    assert [r["step"] for r in second] == list(range(1, STEPS + 1))  # metrics.jsonl appended on resume
    assert "resuming at step 3" in out_second
    # saved by ranks that talked over MPI (mpiexec, comm.backend=auto), read by ranks on gloo
    assert "2 ranks, 1 node x 2 via openmpi" in out_first and "2 ranks, 1 node x 2 via torchrun" in out_second
    table_row = r"^all_to_all\s+{}\s"  # a row of mcr's comm table
    assert re.search(table_row.format("mpi"), out_first, re.M) and re.search(table_row.format("gloo"), out_second, re.M)
    assert not re.search(table_row.format("mpi"), out_second, re.M)
    torch.testing.assert_close(
        torch.tensor(losses_of(second)), torch.tensor(losses_of(uninterrupted)), rtol=LOSS_RTOL, atol=0
    )


# --- settings that must fail, before any process group ---------------------------------------------


def run_main(tmp_path, *overrides):
    from apps.dlrm.train import main

    return main(["--config", TINY, f"out_dir={tmp_path}", *overrides])


def test_unknown_sharding_type_names_the_table_and_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown sharding type 'row_wize'.*sharding.types.t_cat_3.*table_wise"):
        run_main(tmp_path, "sharding.types={t_cat_3: row_wize}")
    with pytest.raises(ConfigError, match=r"unknown table 't_cat_99'"):
        run_main(tmp_path, "sharding.types={t_cat_99: row_wise}")


def test_table_too_large_for_the_memory_given_fails_in_planning(tmp_path):
    # 26 tables x 200k rows x 64 dims = 1.2 GiB of weights; 0.5 GiB per rank on one rank
    with pytest.raises(ConfigError, match=r"do not fit in sharding.memory_gb=0.5 per rank on 1 rank"):
        run_main(
            tmp_path,
            "model.num_embeddings=200000",
            "model.embedding_dim=64",
            "model.dense_arch_layer_sizes=[16,64]",
            "sharding.memory_gb=0.5",
            "sharding.types=table_wise",
        )


def test_bad_data_path_names_the_file(tmp_path):
    missing = tmp_path / "nope.tsv"
    with pytest.raises(ConfigError, match=f"no such file {missing}"):
        run_main(tmp_path, "data.kind=criteo_tsv", f"data.path={missing}")


def test_paper_preset_validates_and_its_tables_plan_onto_32_gpus():
    """The paper-scale preset is not run here; its config must load, pass every check, and its
    ~100 GiB of tables must fit TorchRec's plan for 4 nodes x 8 GPUs."""
    from types import SimpleNamespace

    from torchrec.distributed.model_parallel import get_default_sharders

    from apps.dlrm.config import validate
    from apps.dlrm.model import build_model
    from apps.dlrm.train import plan_sharding

    cfg = load_config(DLRMConfig, ["--config", os.path.join(REPO, "configs", "dlrm", "paper-dcn-1tb.yaml")])
    validate(cfg)
    model = build_model(cfg.model, torch.device("meta"))
    launch = SimpleNamespace(world_size=32, local_world_size=8)
    plan = plan_sharding(cfg, model, get_default_sharders(), launch, torch.device("cuda"))
    tables = plan.plan["model.sparse_arch.embedding_bag_collection"]
    assert len(tables) == 26
    assert len(tables["t_cat_0"].ranks) > 1  # a 40M-row table (20 GiB) is split over GPUs
