"""`python -m mcr.tools.explain`: the route it prints is the runtime's, and it names a table's gaps,
overlaps and another shape. Tables are real files; the route check runs a real 2-rank job."""

import os
import re

import pytest

from mcr.tuning.candidates import parse_bytes, short_bytes
from mcr.tuning.table import Entry, TuningTable
from tests.ranks import run_script, run_tool

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def write_table(path, entries, **fingerprint):
    TuningTable({"world_size": 2, **fingerprint}, [Entry(group_size=2, **e) for e in entries]).save(str(path))
    return str(path)


def explain(*args) -> str:
    """The command as a user runs it, in an environment without MCR_* settings: its stdout."""
    result = run_tool("mcr.tools.explain", *args, timeout=120)
    assert result.returncode in (0, 1) and not result.errors, result.output + result.errors
    return result.output


def problems(out: str) -> list:
    return [line.strip() for line in out.split("problems:", 1)[1].splitlines() if line.strip() not in ("", "none")]


def rows(out: str) -> dict:
    """(op, size in bytes) -> (backend, chunk, rule) from the printed table."""
    table = out.split("\n\n")[1].splitlines()[1:]
    found = {}
    for line in table:
        op, _, size, backend, chunk, rule = re.split(r"\s{2,}", line.strip(), maxsplit=5)
        found[op, parse_bytes(size)] = (backend, chunk, rule)
    return found


def test_a_gap_in_the_table_is_reported_exactly_and_the_default_rule_covers_it(tmp_path):
    path = write_table(
        tmp_path / "gap.yaml",
        [
            {"op": "all_reduce", "min_bytes": 0, "max_bytes": 1024, "backend": "gloo"},
            {"op": "all_reduce", "min_bytes": 1024, "max_bytes": 4096, "backend": "mpi"},
            {"op": "all_reduce", "min_bytes": 16384, "max_bytes": None, "backend": "gloo"},
        ],
    )
    out = explain("--tuning", path, "--world-size", "2", "--nodes", "1", "--sizes", "512,2K,8K,64K")
    assert problems(out) == ["gap: all_reduce float32 at 2 ranks on 1 node: [4K, 16K) has no entry"], out
    got = rows(out)
    assert got["all_reduce", 8192][:2] == ("mpi", "-") and "built-in order" in got["all_reduce", 8192][2], out
    assert "entry 2: all_reduce [16K, inf)" in got["all_reduce", 65536][2], out


def test_overlapping_entries_are_flagged_with_the_one_that_wins(tmp_path):
    path = write_table(
        tmp_path / "overlap.yaml",
        [
            {"op": "all_reduce", "min_bytes": 0, "max_bytes": 1 << 20, "backend": "mpi"},
            {"op": "all_reduce", "min_bytes": 512, "max_bytes": 1024, "backend": "gloo"},
        ],
    )
    found = problems(explain("--tuning", path, "--world-size", "2", "--nodes", "1"))
    assert (
        "overlap: entry 0: all_reduce [0, 1M) and entry 1: all_reduce [512, 1K) meet on [512, 1K); "
        "the lookup takes entry 1 from 512 on"
    ) in found, found
    # past the shadowing entry the lookup finds nothing, though entry 0 covers it on paper
    assert (
        "gap: all_reduce float32 at 2 ranks on 1 node: [1K, inf) has no entry; "
        "entry 0: all_reduce [0, 1M) would cover [1K, 1M) but is shadowed"
    ) in found, found


@pytest.mark.parametrize(
    "fingerprint,asked,said",
    [
        ({"world_size": 4}, ["--world-size", "2"], "measured on 4 ranks but this job has 2"),
        (
            {"nodes": 1, "ranks_per_node": 2},
            ["--world-size", "2", "--nodes", "2"],
            "measured on 1 node(s) but this job runs on 2",
        ),
        (
            {"world_size": 4, "ranks_per_node": 2},
            ["--world-size", "4", "--nodes", "1"],
            "measured with 2 ranks per node but this job has 4",
        ),
    ],
    ids=["world-size", "nodes", "ranks-per-node"],
)
def test_a_table_for_another_shape_is_flagged(tmp_path, fingerprint, asked, said):
    path = tmp_path / "shape.yaml"
    entry = Entry("all_reduce", fingerprint.get("world_size", 2), 0, None, "mpi")
    TuningTable({"world_size": 2, **fingerprint}, [entry]).save(str(path))
    found = [p for p in problems(explain("--tuning", str(path), *asked)) if p.startswith("another shape")]
    assert len(found) == 1 and said in found[0], found
    fits = ["--world-size", str(fingerprint.get("world_size", 2)), "--nodes", str(fingerprint.get("nodes", 1))]
    if "ranks_per_node" in fingerprint:
        fits[-1] = str(int(fits[1]) // fingerprint["ranks_per_node"])
    assert not [p for p in problems(explain("--tuning", str(path), *fits)) if p.startswith("another shape")]


ROUTE_TABLE = [
    {"op": "all_reduce", "min_bytes": 0, "max_bytes": 1024, "backend": "gloo"},
    {"op": "all_reduce", "min_bytes": 1024, "max_bytes": 65536, "backend": "mpi"},
    {"op": "all_reduce", "min_bytes": 65536, "max_bytes": None, "backend": "mpi", "chunk_bytes": 65536},
    {"op": "all_gather", "min_bytes": 0, "max_bytes": None, "backend": "mpi", "inter": "gloo"},
    {"op": "broadcast", "min_bytes": 0, "max_bytes": None, "backend": "nccl"},  # no GPU here: a fallback
    {"op": "reduce_scatter", "min_bytes": 0, "max_bytes": 256, "backend": "gloo"},  # a gap above
]
ROUTE_CALLS = [
    "all_reduce:64",
    "all_reduce:4096",
    "all_reduce:16384",
    "all_reduce:65536",
    "all_reduce:131072",
    "all_gather:4096",
]
ROUTE_CALLS += ["broadcast:16", "reduce_scatter:64", "reduce_scatter:65536"]


@pytest.fixture(scope="module")
def route_job(tmp_path_factory):
    """(table path, the 2-rank job's output): the runtime's routes for ROUTE_CALLS."""
    path = write_table(tmp_path_factory.mktemp("routes") / "routes.yaml", ROUTE_TABLE)
    out = run_script(2, os.path.join(SCRIPTS, "routes.py"), path, *ROUTE_CALLS, env={"MCR_WATCHDOG_TIMEOUT": "60"})
    out = out.check().output
    assert out.count("routes done") == 2, out[-3000:]
    return path, out


def test_the_printed_route_for_each_size_is_the_one_a_2_rank_runtime_takes(route_job):
    path, out = route_job
    sizes = sorted({int(call.split(":")[1]) for call in ROUTE_CALLS})
    printed = rows(explain("--tuning", path, "--world-size", "2", "--nodes", "1", "--sizes", ",".join(map(str, sizes))))
    for call in ROUTE_CALLS:
        op, size = call.split(":")
        taken = set(re.findall(rf"rank \d: route {op} {size} (\S+) (\S+)", out))
        assert len(taken) == 1, (call, out[-3000:])  # both ranks alike
        backend, chunk = taken.pop()  # the backend (a node-aware one: its label) and the chunk it runs
        label, shown, _ = printed[op, int(size)]
        assert (label.split("/chunk=")[0], shown) == (backend, "-" if chunk == "-" else short_bytes(int(chunk))), call
    # the routes exercise every kind of rule
    assert printed["all_reduce", 1 << 17][:2] == ("mpi/chunk=64K", "64K")  # two chunks
    assert printed["all_reduce", 1 << 16][:2] == ("mpi/chunk=64K", "-")  # one chunk: runs whole
    assert printed["all_gather", 4096][0] == "node:mpi+gloo"
    assert "nccl is unavailable" in printed["broadcast", 16][2] and printed["broadcast", 16][0] == "mpi"
    assert "built-in order" in printed["reduce_scatter", 65536][2]


def test_a_fallback_at_run_time_is_said_once_on_rank_0_with_its_reason(route_job):
    path, out = route_job
    said = re.findall(r"mcr: nccl \(the tuning table .*\) is unavailable \((.*)\); using mpi for broadcast", out)
    assert len(said) == 1 and said[0], out[-3000:]  # three choices on two ranks, said once


def test_predict_prints_the_routes_a_job_of_another_size_takes_through_the_model(tmp_path):
    """A table measured at 2 ranks, used by a 4-rank job (tuning_predict): the α-β model moves the
    all-reduce crossover from 768K down to about 647K (662259 bytes), so 700K flips from gloo to mpi."""
    from mcr.tuning.model import fits_for
    from mcr.tuning.rules import entries_for
    from mcr.tuning.table import Curve

    mib, sizes = 1 << 20, [1 << 10, 64 << 10, 256 << 10, 512 << 10, 768 << 10, 1 << 20, 2 << 20]
    latency = {  # mpi: high start-up, fast per byte; gloo: the opposite
        "mpi": [round(100 + 10 * s / mib, 3) for s in sizes],
        "gloo": [round(10 + 200 * s / mib, 3) for s in sizes],
    }
    curve = Curve("all_reduce", 2, "float32", sizes, latency)
    path = str(tmp_path / "measured-at-2.yaml")
    fingerprint = {"world_size": 2, "ranks_per_node": 2}
    TuningTable(fingerprint, entries_for(curve), curves=[curve], model=fits_for(curve)).save(path)
    calls = ["all_reduce:614400", "all_reduce:716800"]  # 600K and 700K
    asked = ["--tuning", path, "--nodes", "1", "--ops", "all_reduce", "--sizes", "600K,700K"]
    at_2 = rows(explain(*asked, "--world-size", "2"))
    out = explain(*asked, "--world-size", "4", "--predict")
    assert "predicted by its model for 4 ranks" in out and problems(out) == [], out
    at_4 = rows(out)
    assert [at_2["all_reduce", s][0] for s in (614400, 716800)] == ["gloo", "gloo"], at_2
    assert [at_4["all_reduce", s][0] for s in (614400, 716800)] == ["gloo", "mpi"], at_4
    job = run_script(4, os.path.join(SCRIPTS, "routes.py"), path, *calls, env={"MCR_TUNING_PREDICT": "1"}).check()
    for call in calls:
        op, size = call.split(":")
        taken = set(re.findall(rf"rank \d: route {op} {size} (\S+) -", job.output))
        assert taken == {at_4[op, int(size)][0]}, (call, job.output[-3000:])  # all four ranks, as printed
    # without --predict the table is one for another shape, and explain says so
    assert any(p.startswith("another shape") for p in problems(explain(*asked, "--world-size", "4"))), asked


def test_a_table_per_device_prints_each_devices_routes_from_its_own_table(tmp_path, monkeypatch, capsys):
    from mcr.tools.explain import main

    for var in [v for v in os.environ if v.startswith("MCR_")]:  # in this process, as explain() runs it
        monkeypatch.delenv(var)

    def explain_here(*args) -> str:
        assert main(list(args)) == 0
        return capsys.readouterr().out

    cpu = write_table(
        tmp_path / "cpu.yaml", [{"op": "all_reduce", "min_bytes": 0, "max_bytes": None, "backend": "gloo"}]
    )
    staged = {"op": "all_reduce", "min_bytes": 65536, "max_bytes": None, "backend": "mpi", "host": True}
    cuda = write_table(
        tmp_path / "cuda.yaml",
        [{"op": "all_reduce", "min_bytes": 0, "max_bytes": 65536, "backend": "nccl"}, staged],
        device="cuda",
        gpu="NVIDIA H100 80GB HBM3",
    )
    asked = ["--tuning", f"{cpu},{cuda}", "--world-size", "2", "--nodes", "1", "--sizes", "4K,1M"]
    out = explain_here(*asked)
    blocks = re.split(r"\n(?=tuning table )", out)
    assert len(blocks) == 2 and "NVIDIA H100 80GB HBM3" in blocks[1] and "on cuda;" in blocks[1], out
    on_cpu, on_cuda = rows(blocks[0]), rows(blocks[1])
    assert on_cpu["all_reduce", 1 << 20][0] == "gloo" and "cpu.yaml (entry 0" in on_cpu["all_reduce", 1 << 20][2]
    assert [on_cuda["all_reduce", s][0] for s in (4096, 1 << 20)] == ["nccl", "mpi/host"], out
    assert "cuda.yaml (entry 1: all_reduce [64K, inf))" in on_cuda["all_reduce", 1 << 20][2], out
    # --device picks one device's routes, from its own table
    assert rows(explain_here(*asked, "--device", "cuda")) == on_cuda
    # two tables for one device: refused naming both, as the runtime refuses them at start-up
    with pytest.raises(SystemExit):
        main(["--tuning", f"{cpu},{cpu}"])
    refused = capsys.readouterr().err
    assert f"tuning tables {cpu} and {cpu} are both for cpu tensors" in refused, refused
