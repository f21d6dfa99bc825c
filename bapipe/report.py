"""Tables: the planner's prediction against a real DeepSpeed pipeline, and a BaPipe-style study."""
import glob
import json
import os
import tempfile

from .cluster import Cluster
from .explore import CostModel, baseline_plan, data_parallel_plan, optimal_plan, search
from .profile import Profile
from .simulate import simulate

STUDY_CLUSTERS = [f"configs/bapipe/{kind}-{n}.yaml" for kind in ("gpu", "fpga") for n in (4, 8, 16)]


def prediction_vs_reality(cluster_path, microbatches=8, micro_batch=4, iters=5, out=None, model_kwargs=None,
                          methods=("uniform", "parameters")):
    """In a real 2-process DeepSpeed pipeline: profile the GPT-like stack (both processes at once,
    as they will run), plan 2 stages (1F1B), train with the planned and DeepSpeed's partitions
    in turn, and print predicted against measured iteration times."""
    from .pipeline_run import run_partitions

    with tempfile.TemporaryDirectory() as tmp:
        profile_path = os.path.join(tmp, "gpt-like.json")
        measured = run_partitions(["planned", *methods], microbatches, micro_batch, iters=iters,
                                  model_kwargs=model_kwargs, plan_cluster=cluster_path, profile_out=profile_path)
        profile = Profile.load(profile_path)
    model = CostModel(profile, Cluster.load(cluster_path), 2, microbatches, "1f1b")
    plans = [optimal_plan(model)] + [baseline_plan(model, m) for m in methods]
    assert plans[0].deepspeed_parts == measured[0]["parts"], "the workers planned another partition"
    rows = []
    print(f"GPT-like stack, 2 stages, 1F1B, {microbatches} micro-batches of {micro_batch}, "
          f"{iters} measured iterations (median)")
    print(f"  {'partition':<11} {'parts':<12} {'predicted ms':>12} {'simulated ms':>12} {'measured ms':>11} {'error':>7}")
    for plan, run in zip(plans, measured):
        sim = simulate(plan)
        error = plan.iteration_s / run["iteration_s"] - 1
        rows.append({"partition": plan.label, "parts": plan.deepspeed_parts, "predicted_s": plan.iteration_s,
                     "simulated_s": sim.iteration_s, "measured_s": run["iteration_s"],
                     "measured_all_s": run["iterations_s"], "error": error, "loss": run["loss"]})
        print(f"  {plan.label:<11} {str(plan.deepspeed_parts):<12} {plan.iteration_s * 1e3:12.1f} "
              f"{sim.iteration_s * 1e3:12.1f} {run['iteration_s'] * 1e3:11.1f} {error:+7.1%}")
    planned = rows[0]["measured_s"]
    fastest = all(planned <= r["measured_s"] for r in rows[1:])
    for r in rows[1:]:
        print(f"  planned vs {r['partition']}: measured speed-up {r['measured_s'] / planned:.2f}x, "
              f"predicted {r['predicted_s'] / rows[0]['predicted_s']:.2f}x")
    print(f"  planned partition at least as fast as {', '.join(methods)}: {'yes' if fastest else 'NO'}")
    result = {"rows": rows, "planned_at_least_as_fast": fastest,
              "max_abs_error": max(abs(r["error"]) for r in rows)}
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _peak_mib(plan):
    return max(simulate(plan).peak_memory_bytes) / 2**20 if plan.schedule != "data-parallel" \
        else plan.stages[0].memory_bytes / 2**20


def study_row(profile, cluster, max_microbatches=64):
    """Planned (searched) vs DeepSpeed uniform at the planned configuration vs a uniform GPipe over
    all devices vs data parallelism, each using as many micro-batches as fit the cap and memory."""
    best, tried = search(profile, cluster, max_microbatches=max_microbatches)
    n = cluster.size
    dp = max((p for p in tried if p.schedule == "data-parallel"), key=lambda p: p.samples_per_s, default=None)
    uniform_same = None
    if best.schedule != "data-parallel":
        uniform_same = baseline_plan(CostModel(profile, cluster, len(best.stages), best.microbatches,
                                               best.schedule, best.replicas), "uniform")
    gpipe_all = None
    if profile.num_layers >= n:
        candidates = []
        for m in sorted({2 ** k for k in range(12) if 2 ** k <= max_microbatches} | {max_microbatches}):
            plan = baseline_plan(CostModel(profile, cluster, n, m, "gpipe"), "uniform")
            if plan and plan.notes["fits_memory"]:
                candidates.append(plan)
        gpipe_all = max(candidates, key=lambda p: p.samples_per_s, default=None)
    row = {"model": profile.model, "cluster": cluster.name, "devices": n,
           "planned": {"config": f"{len(best.stages)}x{best.replicas} {best.schedule} m={best.microbatches}",
                       "samples_per_s": best.samples_per_s, "peak_mib": _peak_mib(best),
                       "parts": best.deepspeed_parts}}
    for name, plan in (("uniform_same_config", uniform_same), ("gpipe_uniform_all", gpipe_all),
                       ("data_parallel", dp)):
        if plan is None or not plan.notes["fits_memory"]:
            row[name] = None
            continue
        row[name] = {"samples_per_s": plan.samples_per_s, "peak_mib": _peak_mib(plan),
                     "speedup": best.samples_per_s / plan.samples_per_s,
                     "config": f"{len(plan.stages)}x{plan.replicas} {plan.schedule} m={plan.microbatches}"}
    return row


def study(profiles_dir, cluster_paths=None, max_microbatches=64, out=None):
    profiles = sorted(glob.glob(os.path.join(profiles_dir, "*.json")))
    if not profiles:
        raise ValueError(f"no profiles in {profiles_dir}; make them with `python -m bapipe profile`")
    rows = []
    print(f"{'model':<10} {'cluster':<8} {'planned config':<20} {'samples/s':>10} {'peak MiB':>9} | "
          f"{'vs uniform':>10} {'vs GPipe-all':>12} {'vs DP':>7} {'DP peak MiB':>11}")
    for path in profiles:
        profile = Profile.load(path)
        for cluster_path in cluster_paths or STUDY_CLUSTERS:
            row = study_row(profile, Cluster.load(cluster_path), max_microbatches)
            rows.append(row)

            def speedup(name):
                return f"{row[name]['speedup']:.2f}x" if row[name] else "n/a"
            planned = row["planned"]
            dp_peak = f"{row['data_parallel']['peak_mib']:.0f}" if row["data_parallel"] else "no fit"
            print(f"{row['model']:<10} {row['cluster']:<8} {planned['config']:<20} {planned['samples_per_s']:10.1f} "
                  f"{planned['peak_mib']:9.0f} | {speedup('uniform_same_config'):>10} "
                  f"{speedup('gpipe_uniform_all'):>12} {speedup('data_parallel'):>7} {dp_peak:>11}")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows
