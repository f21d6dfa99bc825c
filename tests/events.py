"""Ordering events between the ranks of a test script without sleeping: a rank that needs another's
event first waits for it (docs/testing.md, "Write a test"). The ranks of these scripts share a
machine, so an event is a file in a directory the test gives them."""

from __future__ import annotations

import os
import threading
import time

POLL_S = 0.01


def mark(directory: str, event: str) -> None:
    """Say that `event` happened (atomically: a reader never sees half a mark); the mark holds
    this process's id."""
    path = os.path.join(directory, event)
    partial = f"{path}.partial-{os.getpid()}"  # its own: several ranks may mark one event
    with open(partial, "w") as f:
        f.write(str(os.getpid()))
    os.replace(partial, path)


def wait_mark(directory: str, event: str) -> None:
    """Return once `event` was marked; the test's own timeout ends a wait that never does."""
    path = os.path.join(directory, event)
    while not os.path.exists(path):
        time.sleep(POLL_S)


def when_in_a_wait(runtime, then, thread=None) -> None:
    """Call `then()` on a helper thread once `thread` (default: the main one) is blocked in one of
    the runtime's waits: an op's, an async handle's, finalize's closing barrier (each registers
    with the watchdog as it starts waiting, `Runtime.waits`)."""
    ident = (thread or threading.main_thread()).ident

    def watch():
        while ident not in runtime.waits:
            time.sleep(POLL_S)
        then()

    threading.Thread(target=watch, name="test-events", daemon=True).start()
