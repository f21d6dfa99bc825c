"""``python -m bapipe {profile,plan,simulate,link,compare,report}``: see each command's --help."""

import argparse
import json
import sys

from .cluster import Cluster
from .explore import SCHEDULES, CostModel, InfeasibleError, baseline_plan, data_parallel_plan, optimal_plan, search
from .profile import Profile


def _model_kwargs(pairs):
    kwargs = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"model argument {pair!r}: write key=value, e.g. blocks=8")
        kwargs[key] = float(value) if "." in value else int(value)
    return kwargs


def cmd_profile(args):
    from .models import build
    from .profile import profile_stack

    profile = profile_stack(
        build(args.model, **_model_kwargs(args.model_arg)), args.micro_batch, repeats=args.repeats, threads=args.threads
    )
    profile.save(args.out)
    print(f"{profile.model}: {profile.num_layers} layers at micro-batch {args.micro_batch} -> {args.out}")
    for layer in profile.layers:
        print(
            f"  {layer.name:<24} fwd {layer.forward_s * 1e3:8.2f} ms  bwd {layer.backward_s * 1e3:8.2f} ms  "
            f"params {layer.param_bytes / 2**20:7.2f} MiB  stash {layer.activation_bytes / 2**20:7.2f} MiB"
        )


def describe(plan, sim=None):
    lines = [
        f"{plan.label}: {plan.schedule}, {len(plan.stages)} stage(s) x {plan.replicas} replica(s), "
        f"{plan.microbatches} micro-batch(es) per pipeline: iteration {plan.iteration_s * 1e3:.1f} ms"
        + (f" (simulated {sim.iteration_s * 1e3:.1f} ms, bubble {sim.bubble_fraction:.1%})" if sim else "")
        + f", {plan.samples_per_s:.1f} samples/s"
    ]
    for s, stage in enumerate(plan.stages):
        flag = "" if stage.memory_bytes <= stage.memory_limit else "  OVER MEMORY"
        lines.append(
            f"  stage {s}: layers {stage.start}-{stage.stop - 1}  per micro-batch {stage.busy_s * 1e3:7.2f} ms  "
            f"memory {stage.memory_bytes / 2**20:9.1f} MiB / {stage.memory_limit / 2**20:.0f} MiB{flag}"
        )
    if plan.notes.get("partition_method"):
        lines.append(
            f'  DeepSpeed: PipelineModule(layers, partition_method="{plan.notes["partition_method"]}") '
            f"cuts it the same way (parts {plan.deepspeed_parts})"
        )
    elif plan.schedule != "data-parallel":
        lines.append(
            f"  DeepSpeed: PipelineModule parts {plan.deepspeed_parts} "
            f"(bapipe.planned_pipeline.planned_pipeline_module(layers, {plan.deepspeed_parts}, ...))"
        )
    return "\n".join(lines)


def cmd_plan(args):
    from .simulate import draw_timeline, simulate

    profile, cluster = Profile.load(args.profile), Cluster.load(args.cluster)
    if args.stages is None:
        return _search(args, profile, cluster)
    microbatches = args.microbatches or 4 * args.stages
    model = CostModel(profile, cluster, args.stages, microbatches, args.schedule, replicas=args.replicas)
    plan = optimal_plan(model)
    sim = simulate(plan)
    baselines = [b for b in (baseline_plan(model, "uniform"), baseline_plan(model, "parameters")) if b]
    devices = args.stages * args.replicas
    dp = data_parallel_plan(profile, cluster, devices, -(-microbatches * args.replicas // devices))
    if args.timeline:
        draw_timeline(sim, args.timeline, f"{profile.model} {args.schedule} parts {plan.deepspeed_parts}")
    same = [b.label for b in baselines if b.deepspeed_parts == plan.deepspeed_parts]
    plan.notes["partition_method"] = same[0] if same else None  # DeepSpeed would cut it the same way
    if args.json:
        out = plan.to_json()
        out.update(
            partition_method=plan.notes["partition_method"],
            simulated_iteration_s=sim.iteration_s,
            bubble_fraction=sim.bubble_fraction,
            peak_memory_bytes=sim.peak_memory_bytes,
            baselines={b.label: b.to_json() for b in baselines + [dp]},
        )
        print(json.dumps(out, indent=1))
        return
    print(describe(plan, sim))
    for other in baselines + [dp]:
        fits = "" if other.notes["fits_memory"] else " (does not fit in memory)"
        print(
            f"  vs {other.label:<14} {other.iteration_s * 1e3:9.1f} ms{fits}: planned is "
            f"{other.iteration_s / plan.iteration_s:.2f}x as fast"
            + (
                f", parts {other.deepspeed_parts}"
                if other.schedule != "data-parallel"
                else f", {other.microbatches} micro-batch(es) per device"
            )
        )
    best = min([plan] + [b for b in baselines + [dp] if b.notes["fits_memory"]], key=lambda b: b.iteration_s)
    print(f"best: {best.label}")


def _search(args, profile, cluster):
    best, tried = search(profile, cluster, max_microbatches=args.max_microbatches)
    if args.json:
        print(json.dumps({**best.to_json(), "candidates": [plan.to_json() for plan in tried]}, indent=1))
        return
    print(
        f"searched {len(tried)} feasible configurations of {profile.model} on {cluster.name} "
        f"({cluster.size} devices, at most {args.max_microbatches} micro-batches per iteration)"
    )
    top = {}
    for plan in tried:  # the best of each (stages, schedule)
        key = (len(plan.stages), plan.schedule)
        if key not in top or plan.samples_per_s > top[key].samples_per_s:
            top[key] = plan
    print(
        f"  {'stages':>6} {'replicas':>8} {'schedule':<14} {'micro':>5} {'iteration ms':>12} {'samples/s':>10}  parts"
    )
    ranked = sorted(top.values(), key=lambda plan: -plan.samples_per_s)
    for plan in ranked:
        print(
            f"  {len(plan.stages):>6} {plan.replicas:>8} {plan.schedule:<14} {plan.microbatches:>5} "
            f"{plan.iteration_s * 1e3:12.1f} {plan.samples_per_s:10.1f}  {plan.deepspeed_parts}"
        )
    runner_up = ranked[1:2]
    print(describe(best))
    dp = max(
        (plan for plan in tried if plan.schedule == "data-parallel"), key=lambda plan: plan.samples_per_s, default=None
    )
    print(
        "pure data parallelism: "
        + (
            f"{dp.samples_per_s:.1f} samples/s, the winner is {best.samples_per_s / dp.samples_per_s:.2f}x as fast"
            if dp
            else "does not fit in memory"
        )
    )
    if runner_up:
        print(
            f"won: {len(best.stages)} stages, {best.schedule}, {best.microbatches} micro-batches, "
            f"{best.samples_per_s / runner_up[0].samples_per_s:.2f}x the runner-up "
            f"({len(runner_up[0].stages)} stages, {runner_up[0].schedule})"
        )


def cmd_simulate(args):
    from .simulate import draw_timeline, simulate

    profile, cluster = Profile.load(args.profile), Cluster.load(args.cluster)
    model = CostModel(profile, cluster, args.stages, args.microbatches, args.schedule, replicas=args.replicas)
    plan = (
        model.plan([int(v) for v in args.boundaries.split(",")], label="given")
        if args.boundaries
        else optimal_plan(model)
    )
    sim = simulate(plan)
    draw_timeline(sim, args.png, f"{profile.model} {args.schedule} parts {plan.deepspeed_parts}")
    print(describe(plan, sim))
    print(
        f"  peak memory per stage (MiB): {[round(b / 2**20, 1) for b in sim.peak_memory_bytes]}; timeline -> {args.png}"
    )


def cmd_link(args):
    from .link_measure import measure_p2p

    link, points = measure_p2p()
    for size, seconds in points:
        print(f"# {size:>9} B  {seconds * 1e6:9.1f} us one way")
    print(f"link: {{latency_s: {link.latency_s:.2e}, bandwidth_Bps: {link.bandwidth_Bps:.2e}}}")


def cmd_compare(args):
    from .report import prediction_vs_reality

    prediction_vs_reality(
        args.cluster, microbatches=args.microbatches, micro_batch=args.micro_batch, iters=args.iters, out=args.out
    )


def cmd_report(args):
    from .report import study

    study(args.profiles_dir, args.clusters, max_microbatches=args.max_microbatches, out=args.out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bapipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profile", help="measure a layer stack's per-layer costs on this CPU")
    p.add_argument("--model", required=True, help="gpt-like, vgg16, resnet50 or gnmt-like")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE", help="e.g. blocks=8 width=0.5")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("plan", help="best partition (and, without --stages, stage count and schedule)")
    p.add_argument("--profile", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--stages", type=int)
    p.add_argument("--microbatches", type=int, help="per pipeline (default 4 x stages)")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--replicas", type=int, default=1, help="data-parallel copies of the pipeline")
    p.add_argument("--max-microbatches", type=int, default=64, help="search: micro-batches per iteration, at most")
    p.add_argument("--timeline", help="write the simulated timeline PNG here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="simulate a plan (or given boundaries) and draw its timeline")
    p.add_argument("--profile", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--stages", type=int, required=True)
    p.add_argument("--microbatches", type=int, required=True)
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--boundaries", help="first layer of each stage, e.g. 0,6")
    p.add_argument("--png", default="timeline.png")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("link", help="measure gloo send/recv between two local processes")
    p.set_defaults(func=cmd_link)

    p = sub.add_parser("compare", help="planned vs DeepSpeed partitions on a real 2-stage CPU pipeline")
    p.add_argument("--cluster", default="configs/bapipe/cpu-2proc.yaml")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", help="write the results as JSON here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("report", help="BaPipe-style study: planned vs uniform vs data parallel")
    p.add_argument("--profiles-dir", default="configs/bapipe/profiles")
    p.add_argument("--clusters", nargs="+", default=None, help="cluster YAML files (default: the study presets)")
    p.add_argument("--max-microbatches", type=int, default=64)
    p.add_argument("--out", help="write the table as JSON here")
    p.set_defaults(func=cmd_report)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except InfeasibleError as err:
        print(f"infeasible: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
