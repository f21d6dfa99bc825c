"""Event-level simulation of one training iteration of a plan, and its timeline as a PNG.

Each stage runs its operations in the schedule's fixed order; an operation starts when its stage
is free and its input has arrived. A forward ends with the blocking send of its output to the
next stage and a backward with the send of its input gradient to the previous one (the sender
pays, as in the cost model). After its last backward a stage all-reduces its gradients across
replicas and steps its optimizer. The earliest start times over this DAG give the iteration time.
"""

from dataclasses import dataclass

from .explore import Plan


@dataclass
class Op:
    stage: int
    kind: str  # "F", "B" or "step"
    micro: int
    start: float
    compute_s: float  # the F or B itself
    send_s: float  # the blocking send that follows it

    @property
    def end(self):
        return self.start + self.compute_s + self.send_s


@dataclass
class SimResult:
    iteration_s: float
    pipeline_s: float  # until the last backward, before the step
    bubble_fraction: float  # idle share of the stages during the pipeline part
    peak_memory_bytes: list  # per stage
    peak_in_flight: list  # micro-batches stashed at once, per stage
    ops: list


def stage_order(schedule, stages, microbatches, s):
    """The (kind, micro-batch) sequence stage s runs."""
    if schedule == "gpipe":
        return [("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)]
    if schedule == "1f1b":
        warmup = min(stages - s - 1, microbatches)
        order = [("F", k) for k in range(warmup)]
        for k in range(microbatches - warmup):  # steady state: one forward, one backward
            order += [("F", warmup + k), ("B", k)]
        return order + [("B", k) for k in range(microbatches - warmup, microbatches)]
    raise ValueError(f"schedule {schedule!r}: choose gpipe or 1f1b")


def simulate(plan: Plan) -> SimResult:
    stages, microbatches = plan.stages, plan.microbatches
    num_stages = len(stages)
    orders = [stage_order(plan.schedule, num_stages, microbatches, s) for s in range(num_stages)]
    done = {}  # (kind, stage, micro) -> end time
    position, free_at, ops = [0] * num_stages, [0.0] * num_stages, []
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]):
                kind, k = orders[s][position[s]]
                dep = (
                    ("F", s - 1, k)
                    if kind == "F" and s > 0
                    else ("B", s + 1, k)
                    if kind == "B" and s < num_stages - 1
                    else ("F", s, k)
                    if kind == "B"
                    else None
                )
                if dep is not None and dep not in done:
                    break
                stage = stages[s]
                op = Op(
                    s,
                    kind,
                    k,
                    max(free_at[s], done.get(dep, 0.0)),
                    stage.forward_s if kind == "F" else stage.backward_s,
                    stage.send_forward_s if kind == "F" else stage.send_backward_s,
                )
                done[(kind, s, k)] = op.end
                free_at[s] = op.end
                ops.append(op)
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked: an operation waits for one that never runs")
    pipeline_s = max(free_at)
    for s, stage in enumerate(stages):
        ops.append(Op(s, "step", -1, free_at[s], stage.step_s, 0.0))
    iteration_s = max(op.end for op in ops)
    busy = sum(microbatches * (stage.forward_s + stage.backward_s) for stage in stages)
    peak_memory, peak_in_flight = [], []
    for s, stage in enumerate(stages):
        in_flight = peak = 0
        for kind, _ in orders[s]:
            in_flight += 1 if kind == "F" else -1
            peak = max(peak, in_flight)
        peak_in_flight.append(peak)
        peak_memory.append(stage.static_bytes + peak * stage.stash_bytes)
    bubble = 1 - busy / (num_stages * pipeline_s) if pipeline_s else 0.0
    return SimResult(iteration_s, pipeline_s, bubble, peak_memory, peak_in_flight, ops)


def draw_timeline(result: SimResult, path, title="pipeline timeline"):
    """One row per stage: forwards blue, backwards green, sends hatched, the step grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = max(op.stage for op in result.ops) + 1
    fig, ax = plt.subplots(figsize=(12, 0.6 * stages + 1.5))
    colours = {"F": "#4c78a8", "B": "#54a24b", "step": "#9d9d9d"}
    for op in result.ops:
        y = stages - 1 - op.stage
        ax.broken_barh([(op.start, op.compute_s)], (y + 0.1, 0.8), facecolors=colours[op.kind], edgecolor="white")
        if op.send_s > 0:
            ax.broken_barh(
                [(op.start + op.compute_s, op.send_s)],
                (y + 0.1, 0.8),
                facecolors="none",
                edgecolor=colours[op.kind],
                hatch="///",
            )
        if op.kind != "step" and op.compute_s > result.iteration_s / 60:
            ax.text(
                op.start + op.compute_s / 2, y + 0.5, str(op.micro), ha="center", va="center", color="white", fontsize=7
            )
    ax.set_yticks([stages - 1 - s + 0.5 for s in range(stages)], [f"stage {s}" for s in range(stages)])
    ax.set_xlabel("seconds")
    ax.set_title(f"{title}: {result.iteration_s * 1e3:.1f} ms, bubble {result.bubble_fraction:.1%}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
