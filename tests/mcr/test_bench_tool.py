"""`python -m mcr.tools.bench`: any candidate label in --backends, timed beside the runtime's
choice, on a real 2-rank job."""

import json

from mcr.tuning.table import Entry, TuningTable
from tests.ranks import run_ranks


def test_bench_times_candidate_labels_beside_auto_and_names_the_choice(tmp_path):
    # a table sending 64 KiB+ all-reduces to chunked mpi: auto must name that candidate, and the
    # chunked label must be timed as its own column
    table = tmp_path / "t.yaml"
    entries = [
        Entry(op="all_reduce", group_size=2, min_bytes=0, max_bytes=65536, backend="gloo"),
        Entry(op="all_reduce", group_size=2, min_bytes=65536, max_bytes=None, backend="mpi", chunk_bytes=32768),
    ]
    TuningTable({"world_size": 2}, entries).save(str(table))
    rows_path = tmp_path / "rows.json"
    args = ["--ops", "all_reduce", "--min-bytes", "32K", "--max-bytes", "128K", "--iters", "3", "--rounds", "1"]
    args += ["--backends", "gloo,mpi/chunk=32K,auto", "--tuning", str(table), "--no-overhead", "--json", str(rows_path)]
    out = run_ranks(2, ["-m", "mcr.tools.bench", *args]).check().output
    assert "mpi/chunk=32K us" in out, out[-3000:]
    rows = json.loads(rows_path.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [32768, 65536, 131072], rows
    assert [r["auto_backend"] for r in rows] == ["gloo", "mpi/32K", "mpi/32K"], rows
    # the picked candidate is named as its column is, so the table sets the two side by side
    assert [r["auto_pick"] for r in rows] == ["gloo", "mpi/chunk=32K", "mpi/chunk=32K"], rows
    picks = [line.split()[-1] for line in out.splitlines() if line.strip().startswith(("32KiB", "64KiB", "128KiB"))]
    assert len(picks) == 3 and all(p.endswith("%") for p in picks), out[-3000:]
    assert all(r[c] > 0 for r in rows for c in ("gloo", "mpi/chunk=32K", "auto")), rows
    # how busy the machine was, beside the figures (its parsing: tests/mcr/test_machine.py)
    assert out.count("# machine: load average ") == 1, out[-3000:]


def test_bench_refuses_a_bad_label_naming_it():
    result = run_ranks(2, ["-m", "mcr.tools.bench", "--ops", "all_reduce", "--backends", "mpi/chunks=1M"])
    assert result.returncode != 0 and "bad candidate 'mpi/chunks=1M'" in result.output, result.output[-3000:]


def test_the_16_bit_and_large_benches_print_a_row_per_size_and_way():
    # both reach into the MPI backend for the library's own call: a rename there broke bench_half once
    half = run_ranks(2, ["-m", "mcr.tools.bench_half", "--max-bytes", "64", "--rounds", "1"]).check().output
    rows = [line.split() for line in half.splitlines() if line.strip().endswith(tuple("0123456789")) and "B " in line]
    assert [r[0] for r in rows] == ["4B", "16B", "64B"] and all(len(r) == 8 for r in rows), half[-3000:]
    large = run_ranks(2, ["-m", "mcr.tools.bench_large", "--sizes", "1M"]).check().output
    ways = [line.split()[0] for line in large.splitlines() if line.strip().endswith("x")]
    assert {"raw-mpi/1M", "mpi/chunk=1M", "rs+ag", "gloo"} <= set(ways), large[-3000:]
