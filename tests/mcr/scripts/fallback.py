"""A tuning table names a backend that is not running here: every op still runs (on the
built-in order's first backend that can) and rank 0 says so once per op family, naming the
backend and why. Each rank prints the warnings the mcr logger gave it after init:
"rank R warned: MESSAGE". Run with MCR_TUNING_FILE set; usage: fallback.py"""

import logging

import torch

import mcr

mcr.init()
rank, n = mcr.get_rank(), mcr.get_world_size()
warned = []


class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warned.append(record.getMessage())


logging.getLogger("mcr").addHandler(Keep())


def data(r, call, numel):
    """Rank r's input to call number `call`: distinct per rank, per call and per element."""
    return torch.arange(numel, dtype=torch.float32) * (r + 2) + 1000.0 * call + 7.0 * r


call = 0
for _repeat in range(2):  # a route is cached per size: the second pass takes the cached routes
    for numel in range(1, 17):  # each size a new route, made by the same choice
        t = data(rank, call, numel)
        handle = mcr.all_reduce(t, async_op=numel % 2 == 0)
        if handle is not None:
            handle.wait()
        assert torch.equal(t, sum(data(r, call, numel) for r in range(n))), (rank, call)
        call += 1
        out = torch.empty(numel * n)
        mcr.all_gather_into_tensor(out, data(rank, call, numel))
        assert torch.equal(out, torch.cat([data(r, call, numel) for r in range(n)])), (rank, call)
        call += 1
mcr.finalize()
for message in warned:
    print(f"rank {rank} warned: {message}", flush=True)
print(f"rank {rank}: fallback ran {call} calls", flush=True)
