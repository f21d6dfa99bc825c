"""After finalize, no gloo thread of the runtime's groups is left, though the caller still holds
the runtime: the groups are destroyed while Python runs, not at interpreter exit (where a gloo
thread that needs the GIL aborts the process).

    finalize_releases.py VIA     VIA: mcr (mcr.init/finalize) | torch (backend "mcr":
                                 init_process_group/new_group/destroy_process_group) | exit
                                 (mcr.init, and the script ends without finalize: the groups
                                 go at exit, before the interpreter finalizes)
"""

import atexit
import os
import sys
import time

import torch

import mcr

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")  # gloo's worker and transport threads


def gloo_threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # it ended while we looked
            pass
    return [name for name in names if name in GLOO_THREADS]


def gloo_threads_once_ended(within_s=60.0):
    """The gloo threads still listed once those that were joined have left /proc: a join returns
    when the thread clears its id, a moment before the kernel drops its entry, and a loaded
    machine stretched that moment once ('gloo_tcp_loop' listed right after finalize). A thread
    the runtime never ended is still there after `within_s`."""
    deadline = time.monotonic() + within_s
    while (left := gloo_threads()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


def released_at_exit():
    """Registered before mcr.init, so it runs after the runtime's own exit handler."""
    left = gloo_threads_once_ended()
    if left:
        print(f"rank {rank}: gloo threads left at exit without finalize: {left}", flush=True)
    else:
        print(f"rank {rank}: the exit released every gloo group", flush=True)


via = sys.argv[1]
if via == "exit":
    atexit.register(released_at_exit)
if via == "torch":
    import torch.distributed as dist

    from mcr.hooks.torch_backend import init_process_group

    init_process_group(backend="gloo")
    runtime = mcr.api.runtime()
    rank, n = dist.get_rank(), dist.get_world_size()
    sub = dist.new_group(list(range(n)))
    x = torch.full((8,), float(rank + 1))
    dist.all_reduce(x, group=sub, async_op=True).wait()
    dist.all_reduce(x)
else:
    runtime = mcr.init(backend="gloo")
    rank, n = mcr.get_rank(), mcr.get_world_size()
    sub = mcr.new_group(list(range(n)))
    x = torch.full((8,), float(rank + 1))
    mcr.all_reduce(x, group=sub, async_op=True).wait()
    mcr.all_reduce(x)
total = sum(range(1, n + 1))
assert torch.equal(x, torch.full((8,), float(total * n))), x
assert gloo_threads(), "the test needs gloo groups to have started their threads"

if via == "exit":
    sys.exit(0)  # no finalize: released_at_exit looks after the runtime's exit handler ran
if via == "torch":
    # a torch group the caller still holds keeps its gloo backend (registered with torch) until it
    # is dropped, as torch's own gloo groups do; torch's references go with destroy_process_group
    del sub
    dist.destroy_process_group()
else:
    mcr.finalize()
left = gloo_threads_once_ended()
assert not left, f"rank {rank}: gloo threads left after finalize: {left} (runtime still held: {runtime is not None})"
print(f"rank {rank}: finalize released every gloo group via {via}", flush=True)
