"""Tables: the planner's prediction against a real DeepSpeed pipeline, and a BaPipe-style study."""

import dataclasses
import glob
import json
import os
import tempfile

from .cluster import Cluster
from .explore import CostModel, baseline_plan, optimal_plan, search
from .profile import Profile
from .simulate import simulate

STUDY_CLUSTERS = [f"configs/bapipe/{kind}-{n}.yaml" for kind in ("gpu", "fpga") for n in (4, 8, 16)]


def stage_cpu_s(plan):
    """Compute each stage does per iteration: its forwards, backwards and optimizer step."""
    return [plan.microbatches * (stage.forward_s + stage.backward_s) + stage.step_s for stage in plan.stages]


def prediction_vs_reality(
    cluster_path, microbatches=8, micro_batch=4, iters=5, out=None, model_kwargs=None, methods=("uniform", "parameters")
):
    """In a real 2-process DeepSpeed pipeline: profile the GPT-like stack (both processes at once,
    as they will run), plan 2 stages (1F1B), train with the planned and DeepSpeed's partitions
    in turn, and print predicted against measured iteration times."""
    from .pipeline_run import run_partitions

    load_before = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    with tempfile.TemporaryDirectory() as tmp:
        profile_path = os.path.join(tmp, "gpt-like.json")
        measured = run_partitions(
            ["planned", *methods],
            microbatches,
            micro_batch,
            iters=iters,
            model_kwargs=model_kwargs,
            plan_cluster=cluster_path,
            profile_out=profile_path,
        )
        profile = Profile.load(profile_path)
    model = CostModel(profile, Cluster.load(cluster_path), 2, microbatches, "1f1b")
    plans = [optimal_plan(model)] + [baseline_plan(model, method) for method in methods]
    assert plans[0].deepspeed_parts == measured[0]["parts"], "the workers planned another partition"
    rows = []
    print(
        f"GPT-like stack, 2 stages, 1F1B, {microbatches} micro-batches of {micro_batch}, {iters} measured "
        f"iterations per partition, taken in turn (median and fastest)"
    )
    print(
        f"  {'partition':<11} {'parts':<12} {'predicted ms':>12} {'simulated ms':>12} {'fastest ms':>10} "
        f"{'median ms':>10} {'err fastest':>11} {'err median':>10}"
    )
    for plan, run in zip(plans, measured):
        sim = simulate(plan)
        fastest = min(run["iterations_s"])
        rows.append(
            {
                "partition": plan.label,
                "parts": plan.deepspeed_parts,
                "predicted_s": plan.iteration_s,
                "simulated_s": sim.iteration_s,
                "measured_median_s": run["iteration_s"],
                "measured_fastest_s": fastest,
                "measured_all_s": run["iterations_s"],
                "error_vs_fastest": plan.iteration_s / fastest - 1,
                "error_vs_median": plan.iteration_s / run["iteration_s"] - 1,
                "loss": run["loss"],
            }
        )
        row = rows[-1]
        print(
            f"  {plan.label:<11} {str(plan.deepspeed_parts):<12} {plan.iteration_s * 1e3:12.1f} "
            f"{sim.iteration_s * 1e3:12.1f} {fastest * 1e3:10.1f} {run['iteration_s'] * 1e3:10.1f} "
            f"{row['error_vs_fastest']:+11.1%} {row['error_vs_median']:+10.1%}"
        )
    load_after = os.getloadavg()[0]
    print(
        f"  load average (1 min) on this {os.cpu_count()}-core machine: {load_before:.1f} before, "
        f"{load_after:.1f} after; above {os.cpu_count()} other work shared the cores"
    )
    print("  CPU time per stage and iteration (the compute the model predicts, free of other load):")
    for plan, run, row in zip(plans, measured, rows):
        row["stage_cpu_predicted_s"] = stage_cpu_s(plan)
        row["stage_cpu_measured_s"] = run["stage_cpu_s"]
        pairs = ", ".join(
            f"stage {s}: {predicted * 1e3:.0f} vs {measured_s * 1e3:.0f} ms ({predicted / measured_s - 1:+.0%})"
            for s, (predicted, measured_s) in enumerate(zip(row["stage_cpu_predicted_s"], run["stage_cpu_s"]))
        )
        print(f"    {plan.label:<11} predicted vs measured {pairs}")
    planned = rows[0]
    fastest = all(planned["measured_median_s"] <= other["measured_median_s"] for other in rows[1:])
    for other in rows[1:]:
        print(
            f"  planned vs {other['partition']}: measured speed-up "
            f"{other['measured_median_s'] / planned['measured_median_s']:.2f}x (median), "
            f"{other['measured_fastest_s'] / planned['measured_fastest_s']:.2f}x (fastest); "
            f"predicted {other['predicted_s'] / planned['predicted_s']:.2f}x"
        )
    print(f"  planned partition at least as fast as {', '.join(methods)} (median): {'yes' if fastest else 'NO'}")
    result = {
        "rows": rows,
        "planned_at_least_as_fast": fastest,
        "profile": dataclasses.asdict(profile),
        "load_average": [load_before, load_after],
        "max_abs_error_vs_fastest": max(abs(row["error_vs_fastest"]) for row in rows),
        "max_abs_error_vs_median": max(abs(row["error_vs_median"]) for row in rows),
    }
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _peak_mib(plan):
    return (
        max(simulate(plan).peak_memory_bytes) / 2**20
        if plan.schedule != "data-parallel"
        else plan.stages[0].memory_bytes / 2**20
    )


def _summary(plan, best):
    return {
        "config": f"{len(plan.stages)}x{plan.replicas} {plan.schedule} m={plan.microbatches}",
        "samples_per_s": plan.samples_per_s,
        "peak_mib": _peak_mib(plan),
        "speedup": best.samples_per_s / plan.samples_per_s,
        "parts": plan.deepspeed_parts,
        "fits_memory": plan.notes["fits_memory"],
    }


def study_row(profile, cluster, max_microbatches=64):
    """The searched best against: DeepSpeed's uniform partition at the best pipelined
    configuration, a uniform GPipe over all devices, and the best pure data parallelism. Each
    uses the most micro-batches (up to the cap) that fit in memory."""
    best, tried = search(profile, cluster, max_microbatches=max_microbatches)
    devices = cluster.size
    pipelined = [plan for plan in tried if plan.schedule != "data-parallel"]
    best_pipe = max(pipelined, key=lambda plan: plan.samples_per_s, default=None)
    data_parallel = [plan for plan in tried if plan.schedule == "data-parallel"]
    dp = max(data_parallel, key=lambda plan: plan.samples_per_s, default=None)
    uniform_same = None
    if best_pipe:
        uniform_same = baseline_plan(
            CostModel(
                profile, cluster, len(best_pipe.stages), best_pipe.microbatches, best_pipe.schedule, best_pipe.replicas
            ),
            "uniform",
        )
    gpipe_all = None
    if profile.num_layers >= devices:
        candidates = []
        for microbatches in sorted({2**k for k in range(12) if 2**k <= max_microbatches} | {max_microbatches}):
            plan = baseline_plan(CostModel(profile, cluster, devices, microbatches, "gpipe"), "uniform")
            if plan and plan.notes["fits_memory"]:
                candidates.append(plan)
        gpipe_all = max(candidates, key=lambda plan: plan.samples_per_s, default=None)
    row = {"model": profile.model, "cluster": cluster.name, "devices": devices, "best": _summary(best, best)}
    for name, plan, reference in (
        ("best_pipeline", best_pipe, best),
        ("uniform_same_config", uniform_same, best_pipe),
        ("gpipe_uniform_all", gpipe_all, best),
        ("data_parallel", dp, best),
    ):
        row[name] = _summary(plan, reference) if plan else None
    return row


def _speedup(entry):
    return "n/a" if entry is None else "no fit" if not entry["fits_memory"] else f"{entry['speedup']:.2f}x"


def study(profiles_dir, cluster_paths=None, max_microbatches=64, out=None):
    profiles = sorted(glob.glob(os.path.join(profiles_dir, "*.json")))
    if not profiles:
        raise ValueError(f"no profiles in {profiles_dir}; make them with `python -m bapipe profile`")
    print(
        "best: the searched optimum (stages x replicas, schedule, micro-batches per pipeline); speed-ups are\n"
        "its samples/s over the others'; 'pipe vs DS-uniform' compares the best pipelined plan with\n"
        "DeepSpeed's uniform partition at the same configuration; memory is the peak per device (MiB)."
    )
    print(
        f"{'model':<10} {'cluster':<8} {'best':<22} {'samples/s':>10} {'MiB':>5} | {'pipe vs DS-uniform':>18} "
        f"{'vs GPipe-all':>12} {'vs DP':>7} {'DP MiB':>7} {'pipe MiB':>8}"
    )
    rows = []
    for path in profiles:
        profile = Profile.load(path)
        for cluster_path in cluster_paths or STUDY_CLUSTERS:
            row = study_row(profile, Cluster.load(cluster_path), max_microbatches)
            rows.append(row)
            best, dp, pipe = row["best"], row["data_parallel"], row["best_pipeline"]
            dp_mib = f"{dp['peak_mib']:.0f}" if dp else "no fit"
            pipe_mib = f"{pipe['peak_mib']:.0f}" if pipe else "n/a"
            print(
                f"{row['model']:<10} {row['cluster']:<8} {best['config']:<22} {best['samples_per_s']:10.1f} "
                f"{best['peak_mib']:5.0f} | {_speedup(row['uniform_same_config']):>18} "
                f"{_speedup(row['gpipe_uniform_all']):>12} {_speedup(row['data_parallel']):>7} {dp_mib:>7} {pipe_mib:>8}"
            )
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows
