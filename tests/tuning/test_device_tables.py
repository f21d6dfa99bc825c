"""Tables per device and the staged candidate (BACKEND/host): labels, the file, the choice of a
CUDA call from a CUDA table, and start-up reading one table per device. Pure functions: no ranks."""

import pytest
import torch

from mcr import config, startup
from mcr.choose import Call, table_rule
from mcr.topology import Shape
from mcr.tuning.candidates import for_op, label, parse_label
from mcr.tuning.rules import entries_for
from mcr.tuning.table import Choice, Curve, Entry, TuningTable, TuningTableError, TuningTables, load_tables

MiB = 1 << 20


def test_a_staged_label_reads_back_as_its_choice_and_a_misspelt_one_is_refused():
    for text, choice in [
        ("mpi/host", Choice("mpi", host=True)),
        ("mpi/host/chunk=1M", Choice("mpi", MiB, host=True)),
        ("gloo/chunk=256K", Choice("gloo", 256 << 10)),
        ("node:nccl+mpi", Choice("nccl", 0, "mpi")),
    ]:
        assert parse_label(text) == choice and label(choice) == text
    for bad in ("mpi/chunk=1M/host", "mpi/hots", "mpi/host/host", "node:mpi/host+gloo"):
        with pytest.raises(ValueError, match="bad candidate"):
            parse_label(bad)


def test_staged_candidates_are_made_for_cuda_only_and_never_inside_a_node_aware_pair():
    on_cpu = [label(c) for c in for_op("all_reduce", ["mpi", "gloo"], [MiB], node_aware=True)]
    assert on_cpu == ["mpi", "gloo", "mpi/chunk=1M", "gloo/chunk=1M"] + [
        f"node:{a}+{b}" for a in ("mpi", "gloo") for b in ("mpi", "gloo")
    ]
    on_cuda = [label(c) for c in for_op("all_reduce", ["nccl", "mpi"], [MiB], node_aware=True, device="cuda")]
    assert on_cuda[:4] == ["nccl", "mpi", "nccl/host", "mpi/host"]  # the caller drops what cannot run
    assert on_cuda[4:8] == ["nccl/chunk=1M", "mpi/chunk=1M", "nccl/host/chunk=1M", "mpi/host/chunk=1M"]
    assert [c for c in on_cuda if c.startswith("node:")] == [
        "node:nccl+nccl",
        "node:nccl+mpi",
        "node:mpi+nccl",
        "node:mpi+mpi",
    ]
    assert [label(c) for c in for_op("broadcast", ["mpi"], [MiB], device="cuda")] == ["mpi", "mpi/host"]


def test_a_staged_winner_is_written_as_host_true_only_where_true_and_read_back(tmp_path):
    sizes = [1 << k for k in range(10, 25)]
    curve = Curve(
        "all_reduce",
        2,
        "float32",
        sizes,
        {"nccl": [10 + 1e-4 * s for s in sizes], "mpi/host": [40 + 1e-5 * s for s in sizes]},
    )
    written = entries_for(curve, order=["nccl", "mpi/host"])
    path = str(tmp_path / "cuda.yaml")
    TuningTable({"world_size": 2, "device": "cuda"}, written).save(path)
    text = open(path).read()
    staged = [e for e in written if e.host]
    assert staged and text.count("host: true") == len(staged) and "host: false" not in text, text
    entries = TuningTable.load(path).entries
    assert [label(e.choice) for e in entries] == [label(e.choice) for e in written]
    assert label(entries[0].choice) == "nccl" and label(entries[-1].choice) == "mpi/host", entries


def tables(tmp_path, cuda_world_size=2):
    cpu = TuningTable({"world_size": 2}, [Entry("all_reduce", 2, 0, None, "gloo")])
    cuda = TuningTable(
        {"world_size": cuda_world_size, "device": "cuda", "gpu": "NVIDIA H100"},
        [Entry("all_reduce", 2, 0, MiB, "nccl"), Entry("all_reduce", 2, MiB, None, "mpi", host=True)],
    )
    cpu.save(str(tmp_path / "cpu.yaml"))
    cuda.save(str(tmp_path / "cuda.yaml"))
    return f"{tmp_path / 'cpu.yaml'},{tmp_path / 'cuda.yaml'}"


def call(nbytes, device_type):
    return Call("all_reduce", nbytes, 2, 1, torch.float32, device_type, "sum")


def test_a_call_is_chosen_from_the_table_of_its_device(tmp_path):
    both = load_tables(tables(tmp_path))
    assert isinstance(both, TuningTables) and not both.online
    (cpu_choice, cpu_rule), (small, _), (large, large_rule) = (
        table_rule(both, call(64, "cpu")),
        table_rule(both, call(64, "cuda")),
        table_rule(both, call(4 * MiB, "cuda")),
    )
    assert (cpu_choice, small, large) == (Choice("gloo"), Choice("nccl"), Choice("mpi", host=True))
    assert "cpu.yaml (entry 0" in cpu_rule and "cuda.yaml (entry 1: all_reduce [1M, inf))" in large_rule
    # one table speaks for its own device only
    cpu_only = load_tables(str(tmp_path / "cpu.yaml"))
    assert isinstance(cpu_only, TuningTable) and table_rule(cpu_only, call(64, "cuda")) is None
    # the runtime agrees on an uneven op's size where any device's choice depends on it
    assert both.depends_on_size("all_reduce", 2) and not cpu_only.depends_on_size("all_reduce", 2)


def test_two_tables_for_one_device_are_refused_naming_both(tmp_path):
    tables(tmp_path)
    TuningTable.load(str(tmp_path / "cpu.yaml")).save(str(tmp_path / "again.yaml"))
    with pytest.raises(TuningTableError, match=r"tuning tables \S*/cpu.yaml and \S*/again.yaml are both for cpu"):
        load_tables(f"{tmp_path / 'cpu.yaml'}, {tmp_path / 'again.yaml'}")


def test_start_up_fits_each_devices_table_to_the_job_and_names_both(tmp_path):
    shape = Shape(2, 1, 2, (2,))
    cfg = config.load(env={}, tuning=tables(tmp_path))
    fitted = startup.fit_table(startup.read_table(cfg), cfg, shape)
    assert [t.device for t in fitted.tables] == ["cpu", "cuda"]
    said = startup.table_text(fitted)
    assert said.startswith("cpu tuning table ") and "; cuda tuning table " in said and "NVIDIA H100" in said, said
    # the CUDA table measured at another world size is refused as a lone table would be
    cfg = config.load(env={}, tuning=tables(tmp_path, cuda_world_size=4))
    with pytest.raises(TuningTableError, match=r"cuda.yaml was measured on 4 ranks but this job has 2"):
        startup.fit_table(startup.read_table(cfg), cfg, shape)


def test_a_cuda_table_names_its_device_gpu_and_whether_mpi_read_device_memory(monkeypatch):
    from types import SimpleNamespace

    from mcr.tuning.fingerprint import fingerprint

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"NVIDIA H100 ({device})")
    mpi = SimpleNamespace(version=lambda: "Open MPI v5.0.5", cuda_aware=True)
    hosts = SimpleNamespace(hosts=["gpu1", "gpu1"])
    rt = SimpleNamespace(backends={"mpi": mpi}, world_size=2, shape=Shape(2, 1, 2, (2,)), topology=hosts)
    cuda = fingerprint(rt, device=torch.device("cuda", 1))
    assert (cuda["device"], cuda["gpu"], cuda["mpi_cuda_aware"]) == ("cuda", "NVIDIA H100 (cuda:1)", True), cuda
    assert "cuda" in cuda["versions"] and TuningTable(cuda, []).device == "cuda"
    said = TuningTable(cuda, []).fingerprint_text()
    assert "(hosts 'gpu*', cuda, NVIDIA H100 (cuda:1), mpi reads device memory, mpi Open MPI v5.0.5" in said, said
    assert not {"device", "gpu", "mpi_cuda_aware"} & set(fingerprint(rt))  # a CPU table's, as before
