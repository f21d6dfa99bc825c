"""`mcr.measure.time_call`, the timer under mcr.tools.tune and mcr.tools.bench, on a real 1-rank job."""

import re

from tests.ranks import run_ranks

PACED = """
import time
import mcr
from mcr import measure
rt = mcr.init()
for pace in (False, True):
    started = time.perf_counter()
    median = measure.time_call(rt, lambda: time.sleep(0.005), iters=6, warmup=0, pace=pace)
    print(f"pace={pace} median={median:.4f} wall={time.perf_counter() - started:.4f}", flush=True)
mcr.finalize()
"""


def test_a_paced_timing_idles_after_each_call_as_long_as_the_fastest_took_and_reports_the_call_alone():
    out = run_ranks(1, ["-c", PACED]).check().output
    got = {pace: (float(m), float(w)) for pace, m, w in re.findall(r"pace=(\w+) median=(\S+) wall=(\S+)", out)}
    assert set(got) == {"False", "True"}, out[-3000:]
    (median, _), (paced_median, paced_wall) = got["False"], got["True"]
    assert median >= 0.005 and paced_median >= 0.005, got  # the call's own time, idle excluded
    assert paced_wall >= 2 * 6 * 0.005, got  # six calls of at least 5 ms, each followed by as long idle
    # the idle is not timed: counted in, the paced median would be twice the unpaced one
    assert paced_median < 1.5 * median, got


# each call is a barrier; rank 1's first one works 40 ms after it, so rank 1 leaves it 40 ms
# after rank 0 does (as a rank leaves an all-to-all once its own data is in)
SKEWED = """
import time
import mcr
from mcr import measure
rt = mcr.init()
first = [rt.rank == 1]

def call():
    mcr.barrier(backend="gloo")
    if first[0]:
        first[0] = False
        time.sleep(0.04)

median = measure.time_call(rt, call, iters=9, warmup=0, backend="gloo", pace=True)
print(f"rank {rt.rank} median={median:.4f}", flush=True)
mcr.finalize()
"""


def test_a_paced_timing_puts_ranks_back_in_step_after_one_late_call():
    # idling as long as its last call took, the rank that left early idles less, reaches the
    # next barrier first and waits there for the other: the skew stays, every other call holds it
    out = run_ranks(2, ["-c", SKEWED]).check().output
    medians = [float(m) for m in re.findall(r"rank \d median=(\S+)", out)]
    assert len(medians) == 2 and max(medians) < 0.02, out[-3000:]


def test_tune_and_bench_pace_by_default_only_where_the_job_spans_nodes():
    from mcr.measure import paced

    assert [paced(None, nodes) for nodes in (None, 1, 2, 8)] == [False, False, True, True]
    assert paced(False, 2) is False and paced(True, 1) is True  # --no-pace and --pace win
