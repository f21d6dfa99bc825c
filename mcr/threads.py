"""The runtime's threads, each started on the rank's bound GPU, in relaxed CUDA-graph capture mode.

A new thread starts on device 0, whatever the thread that made it set: a finisher, an event or a
pinned buffer made on it would land on another rank's GPU (docs/runtime.md, "CUDA tensors and
streams", rule 4). Every thread of the runtime starts here, so each sets the device its rank bound
(`mcr.streams.bind_device`) before it runs anything.

Under CUDA's default (global) capture mode, an event query from any thread while another thread
captures a CUDA graph invalidates that capture. The runtime's threads query events (the
watchdog reads GPU ops' state), so each sets its own mode to relaxed first, as torch's NCCL
watchdog does (`cudaThreadExchangeStreamCaptureMode`, per thread: the caller's is untouched).
"""

from __future__ import annotations

import ctypes
import functools
import threading

from . import streams

_RELAXED = 2  # cudaStreamCaptureModeRelaxed


def start(target, name: str, args=()) -> threading.Thread:
    """A daemon thread running `target(*args)` on the rank's bound device (none: as it starts)."""
    device = streams.bound_device()

    def run():
        if device is not None:
            streams.set_thread_device(device)
            relax_capture_mode()
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def relax_capture_mode() -> None:
    """This thread's capture mode relaxed: its event queries never break another's capture."""
    exchange = _exchange_capture_mode()
    if exchange is not None:
        mode = ctypes.c_int(_RELAXED)
        exchange(ctypes.byref(mode))


@functools.cache
def _exchange_capture_mode():
    """cudaThreadExchangeStreamCaptureMode of the CUDA runtime torch loaded (torch binds no
    Python call for it), or None where none is loaded."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libcudart" in line}
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path).cudaThreadExchangeStreamCaptureMode
        except (OSError, AttributeError):
            continue
    return None
