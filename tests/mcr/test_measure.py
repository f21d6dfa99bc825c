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


def test_a_paced_timing_idles_after_each_call_as_long_as_it_took_and_reports_the_call_alone():
    out = run_ranks(1, ["-c", PACED]).check().output
    got = {pace: (float(m), float(w)) for pace, m, w in re.findall(r"pace=(\w+) median=(\S+) wall=(\S+)", out)}
    assert set(got) == {"False", "True"}, out[-3000:]
    (median, _), (paced_median, paced_wall) = got["False"], got["True"]
    assert median >= 0.005 and paced_median >= 0.005, got  # the call's own time, idle excluded
    assert paced_wall >= 2 * 6 * 0.005, got  # six calls of at least 5 ms, each followed by as long idle
    # the idle is not timed: counted in, the paced median would be twice the unpaced one
    assert paced_median < 1.5 * median, got
