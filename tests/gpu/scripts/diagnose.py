"""What tests/gpu/check.py's first runs on a GPU raised, measured (configs/tuning/h200-gpu-findings-2026-11-27.txt).

On a machine with one GPU, from the checkout, after `make gpu-wheels` here:

    python3 tests/gpu/scripts/diagnose.py shared-gpu   # staged ops under 32 KiB at 2 ranks on one GPU, with and without MPS
    python3 tests/gpu/scripts/diagnose.py nccl         # what the runtime adds to an NCCL call at world size 1
    python3 tests/gpu/scripts/diagnose.py breaks       # tests/gpu against two broken stream rules: both must fail
    python3 tests/gpu/scripts/diagnose.py ab OTHER.py  # the NCCL call with mcr/streams.py and with OTHER.py, interleaved

Each installs the wheels as `make gpu-check` does and prints medians of per-call host times.
"""

import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import threading
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = [1024, 4096, 16384, 32768, 65536, 1 << 20]


def med(samples):
    return sorted(samples)[len(samples) // 2] * 1e6


def timed(samples, fn, *args):
    started = time.perf_counter()
    fn(*args)
    samples.append(time.perf_counter() - started)


def pinned(nbytes):
    return torch.empty(nbytes // 4, pin_memory=True)


def staged_round_trip(x, host):
    """What staging does, without MPI: copy out, wait for it (the ready event), copy back, synchronize."""
    host.copy_(x, non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
    ev.synchronize()
    x.copy_(host, non_blocking=True)
    torch.cuda.synchronize(x.device)


def copies(tag):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    rows = []
    for n in SIZES:
        x = torch.randn(n // 4, device=dev)
        buf = pinned(n)
        alloc, fresh, reused, sync_only = [], [], [], []
        for _ in range(300):
            timed(alloc, pinned, n)
            timed(fresh, lambda x, n: staged_round_trip(x, pinned(n)), x, n)  # the twin allocated in the timing
            timed(reused, staged_round_trip, x, buf)
            timed(sync_only, torch.cuda.synchronize, dev)
        rows.append(
            f"{tag} {n:>8} B: pinned alloc {med(alloc):7.1f} us, staged round trip fresh {med(fresh):7.1f} us, reused {med(reused):7.1f} us, sync {med(sync_only):5.1f} us"
        )
    print("\n".join(rows), flush=True)


def mcr_sizes():
    import mcr

    mcr.init()
    rank = mcr.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    out = []
    for backend in ("mpi", "gloo"):
        for n in SIZES:
            for where in ("cuda", "cpu"):
                x = torch.full((n // 4,), float(rank + 1), device=dev if where == "cuda" else "cpu")
                for _ in range(20):
                    mcr.all_reduce(x, backend=backend)
                    if where == "cuda":
                        torch.cuda.synchronize(dev)
                samples = []
                for _ in range(200):
                    t = time.perf_counter()
                    mcr.all_reduce(x, backend=backend)
                    if where == "cuda":
                        torch.cuda.synchronize(dev)
                    samples.append(time.perf_counter() - t)
                out.append(f"rank {rank} {backend:>4} {where:>4} {n:>8} B: {med(samples):8.1f} us")
    if rank == 0:
        print("\n".join(out), flush=True)
    for n in (1024, 32768):
        x = torch.full((n // 4,), float(rank + 1), device=dev)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            mcr.all_reduce(x, backend="mpi")
            torch.cuda.synchronize(dev)
        prof.disable()
        if rank == 0:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
            print(f"=== cProfile rank 0, 300 x mpi all_reduce {n} B on cuda\n" + s.getvalue()[-3500:], flush=True)
    mcr.finalize()


def mpi_sizes():
    import mcr

    mcr.init()
    rank = mcr.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    out = []
    for n in SIZES:
        x = torch.full((n // 4,), float(rank + 1), device=dev)
        for _ in range(20):
            mcr.all_reduce(x, backend="mpi")
            torch.cuda.synchronize(dev)
        samples = []
        for _ in range(300):
            t = time.perf_counter()
            mcr.all_reduce(x, backend="mpi")
            torch.cuda.synchronize(dev)
            samples.append(time.perf_counter() - t)
        out.append(f"rank {rank} mpi cuda {n:>8} B: {med(samples):8.1f} us")
    print("\n".join(out), flush=True)
    mcr.finalize()


def nccl_overhead():
    import torch.distributed as dist

    import mcr

    mcr.init()
    dev = torch.device("cuda", torch.cuda.current_device())
    pg = dist.ProcessGroupNCCL(dist.HashStore(), 0, 1)
    for n in (1024, 1 << 20, 64 << 20):
        x = torch.ones(n // 4, device=dev)
        ways = {
            "torch PG allreduce().wait()": lambda x=x: pg.allreduce([x]).wait(),
            "mcr.all_reduce(nccl)": lambda x=x: mcr.all_reduce(x, backend="nccl"),
            "mcr.all_reduce(nccl, async).wait()": lambda x=x: mcr.all_reduce(x, backend="nccl", async_op=True).wait(),
            "mcr.all_reduce(auto)": lambda x=x: mcr.all_reduce(x),
        }
        for name, call in ways.items():
            for _ in range(30):
                call()
            torch.cuda.synchronize(dev)
            host, synced = [], []
            for _ in range(300):
                t = time.perf_counter()
                call()
                host.append(time.perf_counter() - t)
                torch.cuda.synchronize(dev)
                synced.append(time.perf_counter() - t)
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            for _ in range(300):
                call()
            torch.cuda.synchronize(dev)
            burst = (time.perf_counter() - t) / 300
            print(
                f"nccl solo {n:>9} B {name:<36} host {med(host):7.1f} us, to sync {med(synced):7.1f} us, 300 back to back {burst * 1e6:7.1f} us each",
                flush=True,
            )
    pg.shutdown()
    mcr.finalize()


def micro():
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    s = torch.cuda.current_stream(dev)
    x = torch.ones(256, device=dev)
    ev = torch.cuda.Event()
    ev.record()
    torch.cuda.synchronize()

    def enter_stream():
        with torch.cuda.stream(s):
            pass

    def new_event_record():
        torch.cuda.Event().record(s)

    cases = {
        "torch.cuda.current_stream(dev)": lambda: torch.cuda.current_stream(dev),
        "with torch.cuda.stream(s)": enter_stream,
        "torch.cuda.Event() + record": new_event_record,
        "current_stream(dev).wait_event(ev)": lambda: torch.cuda.current_stream(dev).wait_event(ev),
        "ev.query() (done)": ev.query,
        "x.add_(1) (a kernel launch)": lambda: x.add_(1),
        "threading.Event().set()": threading.Event().set,
    }
    for name, call in cases.items():
        for _ in range(100):
            call()
        t = time.perf_counter()
        for _ in range(3000):
            call()
        print(f"micro {name:<40} {(time.perf_counter() - t) / 3000 * 1e6:6.2f} us", flush=True)


def nccl_variant():
    import mcr

    mcr.init()
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(256, device=dev)
    for _ in range(50):
        mcr.all_reduce(x, backend="nccl")
    torch.cuda.synchronize(dev)
    host = []
    for _ in range(500):
        t = time.perf_counter()
        mcr.all_reduce(x, backend="nccl")
        host.append(time.perf_counter() - t)
    torch.cuda.synchronize(dev)
    tag = os.environ.get("VARIANT", "?")
    print(f"variant {tag:<44} mcr.all_reduce(nccl) 1 KiB host {med(host):7.1f} us", flush=True)
    if tag == "default":
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            mcr.all_reduce(x, backend="nccl")
        torch.cuda.synchronize(dev)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print(out.getvalue()[-5000:], flush=True)
    mcr.finalize()


# --- drivers: each prepares the wheels as gpu-check does and runs the workers above -------------
def prepared():
    sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
    import check

    step = check.install(os.path.join(REPO, ".gpu-wheels"), "/tmp/mcr-site", "/tmp/mcr-wheels.log")
    print("wheels:", step.status, step.note, flush=True)
    return check.prepared_env("/tmp/mcr-site")


def go(name, argv, env, timeout=90, cwd=REPO, beside=None):
    """Run `argv` (and `beside` at the same time), printing its output under `name`."""
    print(f"##### {name}", flush=True)
    procs = [subprocess.Popen(a, env=env, cwd=cwd) for a in (argv, beside) if a]
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            print(f"{name}: timed out", flush=True)


def ranks(n, mode, script=__file__):
    return [sys.executable, "-m", "launch.local", "-n", str(n), os.path.abspath(script), mode]


def shared_gpu():
    env = prepared()
    me = [sys.executable, __file__]
    go("copies alone", me + ["copies", "alone"], env)
    go("copies, two processes at once", me + ["copies", "twin-a"], env, beside=me + ["copies", "twin-b"])
    go("mcr 1 rank", ranks(1, "mcr-sizes"), env)
    go("mcr 2 ranks", ranks(2, "mcr-sizes"), env)
    mps = shutil.which("nvidia-cuda-mps-control")
    print("MPS control:", mps, flush=True)
    if mps:
        go("mpi 2 ranks, no MPS", ranks(2, "mpi-sizes"), env)
        subprocess.run([mps, "-d"], env=env)
        time.sleep(1)
        go("mpi 2 ranks, under MPS", ranks(2, "mpi-sizes"), env)
        subprocess.run([mps], input=b"quit\n", env=env)


def nccl():
    env = prepared()
    go("micro", [sys.executable, __file__, "micro"], env)
    go("nccl overhead", ranks(1, "nccl-overhead"), env)
    variants = {
        "default": {},
        "MCR_PROGRESS_THREAD=0": {"MCR_PROGRESS_THREAD": "0"},
        "MCR_BACKENDS=nccl,gloo": {"MCR_BACKENDS": "nccl,gloo"},
        "MCR_BACKENDS=nccl,gloo MCR_PROGRESS_THREAD=0": {"MCR_BACKENDS": "nccl,gloo", "MCR_PROGRESS_THREAD": "0"},
    }
    for tag, extra in variants.items():
        go(f"variant {tag}", ranks(1, "nccl-variant"), dict(env, VARIANT=tag, **extra), timeout=60)


BREAKS = {  # name: [(file, what the rule's code says, what the break says instead)]
    "no ready wait (rule 1)": [
        ("mcr/streams.py", "                self._wait_ready(order)\n", "                pass\n"),
        (
            "mcr/streams.py",
            "self.backend.issue_after(partial(self._wait_ready, order),",
            "self.backend.issue_after(lambda: None,",
        ),
    ],
    "caller never waits (rule 2)": [
        ("mcr/streams.py", "torch.cuda.current_stream(self.device).wait_event(self.done)", "pass"),
    ],
}


def breaks():
    env = prepared()
    for name, edits in BREAKS.items():
        copy = f"/tmp/mcr-broken-{len(name)}"
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".gpu-wheels", "runs", ".venv"), dirs_exist_ok=True)
        for path, old, new in edits:
            with open(os.path.join(REPO, path)) as f:
                text = f.read()
            assert old in text, f"{name}: {path} no longer says {old!r}"
            with open(os.path.join(copy, path), "w") as f:
                f.write(text.replace(old, new))
        broken_env = dict(env, PYTHONPATH=copy + os.pathsep + env["PYTHONPATH"])
        test = ["tests/gpu/test_shared_gpu_ops.py", "-k", "staged_mpi or gloo"]
        go(
            f"break: {name}",
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *test],
            broken_env,
            150,
            copy,
        )


def ab(other_streams):
    env = prepared()
    old = "/tmp/mcr-other-streams"
    shutil.copytree(REPO, old, ignore=shutil.ignore_patterns(".gpu-wheels", "runs", ".venv"), dirs_exist_ok=True)
    shutil.copy(other_streams, os.path.join(old, "mcr", "streams.py"))
    for round_ in (1, 2):
        for tag, tree in (("mcr/streams.py", REPO), (other_streams, old)):
            tree_env = dict(env, PYTHONPATH=tree + os.pathsep + env["PYTHONPATH"])
            script = os.path.join(tree, "tests", "gpu", "scripts", "diagnose.py")
            go(f"nccl overhead, {tag}, round {round_}", ranks(1, "nccl-overhead", script), tree_env, 40, tree)


WORKERS = {"copies": copies, "mcr-sizes": mcr_sizes, "mpi-sizes": mpi_sizes, "nccl-overhead": nccl_overhead}
WORKERS.update({"micro": micro, "nccl-variant": nccl_variant})
DRIVERS = {"shared-gpu": shared_gpu, "nccl": nccl, "breaks": breaks, "ab": ab}

if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    (WORKERS.get(what) or DRIVERS[what])(*args)
