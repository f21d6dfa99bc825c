"""An async NCCL op the GPU never runs (the stand-in's GPU runs nothing unless told), with the
progress thread off: mcr's watchdog must still see it and end the job naming it. Prints
`NOT ENDED` if the watchdog let it wait. Usage: nccl_hang.py (MCR_WATCHDOG_TIMEOUT=2)."""

import threading

from tests.streams import cuda_model as cm

cm.install()

import torch  # noqa: E402

import mcr  # noqa: E402

rt = mcr.init(progress_thread=False)
assert rt.progress is None
mcr.all_reduce(cm.cuda_like(torch.ones(4)), async_op=True)  # never waited on, never run
threading.Event().wait(10 * rt.cfg.watchdog_timeout_s)  # the watchdog ends the process before this returns
print("NOT ENDED", flush=True)
