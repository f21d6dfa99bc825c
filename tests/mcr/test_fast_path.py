"""The MPI fast path: float16/bfloat16 reductions on MPI (not a gloo fallback), and chunked
all-reduces shown whole in the comm log; the blocking all-reduce's hot path."""

import os

from mcr.tuning.table import Entry, TuningTable
from tests.ranks import run_script


def test_fast_path_results_match_reference_and_log_shows_callers_ops(tmp_path):
    table = tmp_path / "chunked.yaml"
    entries = [
        Entry(op="all_reduce", group_size=2, min_bytes=0, max_bytes=1 << 20, backend="mpi"),
        Entry(op="all_reduce", group_size=2, min_bytes=1 << 20, max_bytes=None, backend="mpi", chunk_bytes=1 << 20),
    ]
    TuningTable(fingerprint={"world_size": 2}, entries=entries).save(str(table))
    out = run_script(2, os.path.join(os.path.dirname(__file__), "scripts/fast_path.py"), table).check().output
    # per 16-bit dtype: 5 all_reduce ops, async, 2 small, chunked, gloo, 2 reduce-scatters (+ reduce on rank 1);
    # 2 float32
    assert "rank 0: OK 26 checks" in out and "rank 1: OK 28 checks" in out, out[-3000:]
    assert "cannot run" not in out, out[-3000:]  # no fallback warning


def test_a_ready_route_serves_only_the_calls_that_would_choose_it():
    """The api's shortcut to a ready route (mcr.runner): another dtype, size, explicit or
    forced backend, or a tensor whose storage was swapped takes its own route; each call is
    logged and recorded once."""
    out = run_script(2, os.path.join(os.path.dirname(__file__), "scripts/hot_path.py")).check().output
    assert "rank 0: hot path OK 11 checks" in out and "rank 1: hot path OK 11 checks" in out, out[-3000:]
