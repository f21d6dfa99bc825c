"""`mcr.inflight.InFlight`, the one owner of ops in flight, on its own (no ranks)."""

import sys
import threading
import time

from mcr.inflight import InFlight


class Op:
    """What InFlight reads of a handle when it drops completed ones."""

    def __init__(self, done):
        self.done = done


def test_dropping_completed_ops_never_empties_the_list_while_one_is_pending():
    # The hot path ("anything in flight?") and the progress thread (its newest op) read the deque
    # without the lock; a drop that passed through empty let a blocking op skip completing an
    # earlier dropped AVG, and the progress thread index an empty deque (IndexError, job aborted).
    flight = InFlight()
    flight.add(None, Op(False))  # an op that stays pending throughout
    seen_empty, stop = [], threading.Event()

    def reader():
        entries = flight.entries
        while not stop.is_set():
            if not entries:
                seen_empty.append(True)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often enough to land inside a drop
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        until = time.monotonic() + 1.0
        while time.monotonic() < until:  # the old drop was caught within ~100 rounds here
            flight.add(None, Op(True))
            flight.forget_completed()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert not seen_empty, f"the deque was seen empty {len(seen_empty)} times while an op was pending"
    assert [handle.done for _, handle in flight.entries] == [False]
