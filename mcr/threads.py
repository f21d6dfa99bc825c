"""The runtime's threads, each started on the rank's bound GPU.

A new thread starts on device 0, whatever the thread that made it set: a finisher, an event or a
pinned buffer made on it would land on another rank's GPU (docs/runtime.md, "CUDA tensors and
streams", rule 4). Every thread of the runtime starts here, so each sets the device its rank bound
(`mcr.streams.bind_device`) before it runs anything.
"""

from __future__ import annotations

import threading

from . import streams


def start(target, name: str, args=()) -> threading.Thread:
    """A daemon thread running `target(*args)` on the rank's bound device (none: as it starts)."""
    device = streams.bound_device()

    def run():
        if device is not None:
            streams.set_thread_device(device)
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
