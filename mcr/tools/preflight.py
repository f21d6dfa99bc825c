"""Check a job's placement before a long run: every rank's GPU, cores, MPI and a collective on
each backend, in one table.

    python -m launch preflight --system polaris --nodes 2 --account P --submit   # as a batch job
    python -m launch.local -n 2 -m mcr.tools.preflight                          # here

Every rank reports its host, its local rank, CUDA_VISIBLE_DEVICES, the GPU the runtime bound (its
UUID and the cores nearest it, from sysfs) and its own cores; the MPI library, whether the runtime
hands it CUDA tensors and that library's all-reduce self-test (`mcr.backends.mpi_cuda`); an NCCL
all-reduce among its node's ranks; a gloo and an MPI all-reduce across every node. Rank 0 prints
the table and each problem, naming the rank and the fix; every rank exits 1 where any check
failed: two ranks on one GPU, a rank whose cores are not its GPU's, two ranks bound to the same
cores, a failed op. Without a GPU the GPU checks say "no GPU" and pass. The job script's
`out_dir=... name=...` put a copy of the table in that run dir (preflight.txt); other arguments are
ignored.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch

import mcr
from mcr.backends import mpi_cuda

NO_GPU = "no GPU"
SYSFS_PCI = "/sys/bus/pci/devices"
FIXES = {
    "shared": "give each rank its own GPU: as many ranks per node as GPUs, each seeing its own "
    "(CUDA_VISIBLE_DEVICES per rank) or all of the node's (srun --gpu-bind=none)",
    "binding": "bind each rank to the cores of its GPU's NUMA node (srun --cpu-bind, mpiexec --cpu-bind depth, "
    "mpirun --map-by/--bind-to), or give each rank the GPU nearest its cores (launch/gpu_affinity_reversed.sh)",
    "cores": "give each rank cores of its own (--cpus-per-task with srun --cpu-bind=cores; mpiexec --depth N "
    "--cpu-bind depth; jsrun --bind packed:N)",
    "nccl": "check NCCL's network settings (NCCL_NET and its plugin: launch --no-nccl-plugin runs without it) "
    "and NCCL_DEBUG=INFO's log",
    "gloo": "name the fast network's interface (interface: in the system file, or GLOO_SOCKET_IFNAME)",
    "mpi": "check the MPI launch (srun --mpi=, the library mpi4py loads: mpi4py.MPI.Get_library_version())",
    "mpi_cuda": f"set {mpi_cuda.SETTING}=false to stage GPU tensors through host memory",
}


# --- what a rank sees --------------------------------------------------------------------------
def cpulist(text: str) -> set[int]:
    """The kernel's CPU list form, "0-3,8,10-11", as a set."""
    cpus = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpus_text(cpus) -> str:
    """A set of CPUs in the kernel's list form (the reverse of `cpulist`)."""
    runs, ordered = [], sorted(cpus)
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"


def gpu_cpus(device) -> set[int] | None:
    """The cores nearest a GPU (its PCI device's local_cpulist), or None where sysfs does not say."""
    props = torch.cuda.get_device_properties(device)
    bus, slot = getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None)
    if bus is None or slot is None:  # a torch that does not say
        return None
    address = f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{slot:02x}.0"
    try:
        with open(os.path.join(SYSFS_PCI, address, "local_cpulist")) as f:
            return cpulist(f.read())
    except OSError:
        return None


def place(rt) -> dict:
    """This rank's host, local rank, GPU and cores."""
    device = rt.device
    row = {
        "rank": rt.rank,
        "host": socket.gethostname(),
        "local_rank": rt.info.local_rank,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"),
        "cpus": sorted(os.sched_getaffinity(0)),
        "all_cpus": os.cpu_count(),
        "gpu": NO_GPU,
        "uuid": "",
        "gpu_cpus": None,
        "gpus_seen": torch.cuda.device_count() if device is not None else 0,
    }
    if device is not None:
        row["gpu"] = f"cuda:{device.index}"
        row["uuid"] = str(torch.cuda.get_device_properties(device).uuid)
        near = gpu_cpus(device)
        row["gpu_cpus"] = sorted(near) if near is not None else None
    return row


# --- the checks that run ops -------------------------------------------------------------------
def all_reduce_check(rt, backend: str, group=None, device=None) -> str:
    """ "ok", or what went wrong: every member adds its own values (rank-shifted), checked whole."""
    ranks = group.ranks if group is not None else list(range(rt.world_size))
    values = torch.arange(1000, dtype=torch.float64)
    mine = (values + 1000 * rt.rank).to(device or "cpu")
    try:
        mcr.all_reduce(mine, group=group, backend=backend)
    except Exception as exc:  # noqa: BLE001 (any failure is the answer; the table names it)
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    expected = values * len(ranks) + 1000 * sum(ranks)
    got = mine.cpu()
    if not torch.equal(got, expected):
        index = int(torch.nonzero(got != expected)[0][0])
        return f"failed: element {index} is {got[index].item()}, expected {expected[index].item()}"
    return "ok"


def mpi_check(rt) -> dict:
    """The MPI library, whether CUDA tensors go to it, its all-reduce self-test, and an all-reduce
    over the world."""
    mpi = rt.backends.get("mpi")
    if mpi is None:
        why = rt.unavailable.get("mpi", "not started")
        failed = rt.info.mpi_world  # a launcher that started an MPI world, yet no MPI: a problem
        return {"library": "-", "cuda": "-", "self_test": "-", "op": f"{'failed' if failed else 'n/a'}: {why}"}
    library = mpi.MPI.Get_library_version().strip().splitlines()[0].split(",")[0]  # "Open MPI v5.0.11"
    on = rt.device if mpi.cuda_aware else torch.device("cpu")
    comm = mpi.world.Dup()
    try:
        mpi_cuda.self_test(comm, mpi.MPI, device=on, why=mpi.cuda_aware_reason)
        self_test = f"ok on {'GPU' if on.type == 'cuda' else 'host'} memory"
    except mpi_cuda.MpiCudaAwareError as exc:
        self_test = f"failed: {exc}"
    finally:
        comm.Free()
    cuda = ("yes: " if mpi.cuda_aware else "no: ") + mpi.cuda_aware_reason
    return {"library": library, "cuda": cuda, "self_test": self_test, "op": all_reduce_check(rt, "mpi")}


def nccl_check(rt, node_groups) -> str:
    """An NCCL all-reduce among this rank's node's ranks."""
    if rt.device is None:
        return NO_GPU
    if "nccl" not in rt.backends:
        return f"failed: nccl unavailable: {rt.unavailable.get('nccl', 'not started')}"
    group = next(g for g in node_groups if rt.rank in g.ranks)
    if "nccl" in group.unavailable:
        return f"failed: {group.unavailable['nccl']}"
    return all_reduce_check(rt, "nccl", group=group, device=rt.device)


# --- the verdict ---------------------------------------------------------------------------------
def problems(rows: list[dict]) -> list[str]:
    """Every problem of the job, one line each: the rank, what is wrong, the fix."""
    found = []
    by_gpu = {}
    for row in rows:
        if row["uuid"]:
            first = by_gpu.setdefault(row["uuid"], row)
            if first is not row:
                found.append(
                    f"rank {row['rank']} ({row['host']}) shares GPU {row['uuid']} with rank {first['rank']}, so NCCL "
                    f"cannot run between them. Fix: {FIXES['shared']}"
                )
        bound = len(row["cpus"]) < row["all_cpus"]
        if bound and row["gpu_cpus"] and not set(row["cpus"]) <= set(row["gpu_cpus"]):
            found.append(
                f"rank {row['rank']} ({row['host']}) runs on cores {cpus_text(row['cpus'])}, but its GPU "
                f"{row['gpu']} (CUDA_VISIBLE_DEVICES={row['visible']}) is nearest cores {cpus_text(row['gpu_cpus'])}. "
                f"Fix: {FIXES['binding']}"
            )
    for i, row in enumerate(rows):
        for other in rows[:i]:
            both_bound = len(row["cpus"]) < row["all_cpus"] and len(other["cpus"]) < other["all_cpus"]
            shared = set(row["cpus"]) & set(other["cpus"])
            if row["host"] == other["host"] and both_bound and shared:
                found.append(
                    f"rank {row['rank']} ({row['host']}) is bound to cores {cpus_text(shared)} that rank "
                    f"{other['rank']} is bound to too. Fix: {FIXES['cores']}"
                )
                break
    for row in rows:
        checks = [
            ("nccl", "NCCL all-reduce among the node's ranks", row["nccl"]),
            ("gloo", "gloo all-reduce across the nodes", row["gloo"]),
            ("mpi", "MPI all-reduce across the nodes", row["mpi"]["op"]),
            ("mpi_cuda", "MPI's all-reduce self-test", row["mpi"]["self_test"]),
        ]
        for kind, what, result in checks:
            if result.startswith("failed"):
                found.append(f"rank {row['rank']} ({row['host']}): {what} {result}. Fix: {FIXES[kind]}")
    return found


def table(rows: list[dict]) -> str:
    header = ["rank", "host", "local", "CUDA_VISIBLE_DEVICES", "GPU", "GPU cores", "cores", "nccl", "gloo", "mpi"]
    body = []
    for row in rows:
        gpu = row["gpu"] if not row["uuid"] else f"{row['gpu']} {row['uuid'][:12]}"
        near = cpus_text(row["gpu_cpus"]) if row["gpu_cpus"] else "-"
        cores = "all" if len(row["cpus"]) == row["all_cpus"] else cpus_text(row["cpus"])
        ops = [row["nccl"], row["gloo"], row["mpi"]["op"]]
        body.append(
            [str(row["rank"]), row["host"], str(row["local_rank"]), row["visible"], gpu, near, cores]
            + [op if op in ("ok", NO_GPU) else op.split(":")[0] for op in ops]
        )
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *body]]
    libraries = sorted({(row["mpi"]["library"], row["mpi"]["cuda"], row["mpi"]["self_test"]) for row in rows})
    for library, cuda, self_test in libraries:
        lines.append(f"MPI: {library}; CUDA tensors to MPI: {cuda}; self-test: {self_test}")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------------
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings = dict(arg.split("=", 1) for arg in argv if "=" in arg)  # out_dir=, name= from job scripts
    rt = mcr.init(watchdog_timeout_s=float(os.environ.get("MCR_WATCHDOG_TIMEOUT") or 120))
    row = place(rt)
    # every node's group, made by every rank in the same order (new_group is collective)
    node_groups = [
        mcr.new_group([r for r, node in enumerate(rt.topology.node_of) if node == index])
        for index in range(len(rt.topology.node_names))
    ]
    row["nccl"] = nccl_check(rt, node_groups)
    row["gloo"] = all_reduce_check(rt, "gloo")
    row["mpi"] = mpi_check(rt)
    # through the rendezvous store, which works whatever failed above: rank 0 reads every row
    store = rt.store
    store.set(f"preflight/{rt.rank}", json.dumps(row))
    if rt.rank == 0:
        rows = [json.loads(store.get(f"preflight/{r}")) for r in range(rt.world_size)]
        found = problems(rows)
        nodes = len({r["host"] for r in rows})
        verdict = f"preflight: {len(found)} problem(s)" if found else "preflight: every check passed"
        report = "\n".join([table(rows), *found, f"{verdict} ({len(rows)} ranks on {nodes} node(s))"])
        print(report, flush=True)
        if "out_dir" in settings and "name" in settings:
            run_dir = os.path.join(settings["out_dir"], settings["name"])
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, "preflight.txt"), "w") as f:
                f.write(report + "\n")
        store.set("preflight/verdict", "1" if found else "0")
    failed = store.get("preflight/verdict") == b"1"
    mcr.finalize()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
