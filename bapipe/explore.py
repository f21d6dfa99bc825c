"""Cost model and partition search: the exact dynamic programme, brute force, baselines.

A plan cuts the profiled layers into p contiguous, non-empty stages run by ``replicas``
identical pipelines (replica r's stage s runs on device r*p + s). Per micro-batch, stage s
computes F_s and B_s (profiled time / device speed) and, with blocking transfers, its sender
pays each transfer: c_out(s) after its forward (its output to stage s+1) and c_in(s) after its
backward (the gradient of its input back to stage s-1). After the flush every stage all-reduces
its gradients across replicas and steps its optimizer (``step_s``).

Iteration time (the formulas of the issue, transfers folded in):
  GPipe: sum(F+c_out) + (m-1) max(F+c_out) + sum(B+c_in) + (m-1) max(B+c_in) + max(step)
  1F1B:  sum(t) + (m-1) max(t) + max(step),   t = F + B + c_out + c_in
Memory of stage s: parameters * bytes_per_param_state + in-flight micro-batches * stashed
activations, in flight = m for GPipe and min(p-s, m) for 1F1B.

The objective mixes a sum and maxima, so a DP keeping one number per state is not exact. The
DP over (stage, last layer) keeps, per state, the Pareto set of (sum, max_a, max_b, max_step):
any completion is monotone in each, so dominated labels can never win and the result is exact.
That is O(p * L^2) transitions times the size of the label sets, which stay small: at most 59
labels and 0.13 s per configuration on the study's profiles (8 stages, 11-18 layers).
"""

import itertools
import math
from dataclasses import dataclass, field

from .cluster import Cluster
from .profile import Profile

SCHEDULES = ("gpipe", "1f1b")


class InfeasibleError(ValueError):
    """No partition fits the devices' memory; ``needed_bytes`` is the smallest memory that would."""

    def __init__(self, message, needed_bytes):
        super().__init__(message)
        self.needed_bytes = needed_bytes


@dataclass
class Stage:
    start: int
    stop: int
    forward_s: float
    backward_s: float
    send_forward_s: float  # c_out: output to the next stage, paid after each forward
    send_backward_s: float  # c_in: input gradient to the previous stage, paid after each backward
    step_s: float  # gradient all-reduce across replicas + optimizer step
    static_bytes: float  # weights, gradients, optimizer state
    stash_bytes: float  # activations stashed per micro-batch in flight
    memory_bytes: float  # static + planned in-flight micro-batches * stash
    memory_limit: float

    @property
    def busy_s(self):
        return self.forward_s + self.backward_s + self.send_forward_s + self.send_backward_s


@dataclass
class Plan:
    schedule: str
    microbatches: int  # per pipeline
    replicas: int
    stages: list
    iteration_s: float
    micro_batch: int = 1  # samples per micro-batch (from the profile)
    label: str = "planned"
    notes: dict = field(default_factory=dict)

    @property
    def boundaries(self):
        return [s.start for s in self.stages]

    @property
    def deepspeed_parts(self):
        """``PipelineModule``'s own ``parts``: the first layer of each stage, then the layer count."""
        return self.boundaries + [self.stages[-1].stop]

    @property
    def samples(self):
        return self.microbatches * self.replicas * self.micro_batch

    @property
    def samples_per_s(self):
        return self.samples / self.iteration_s

    def to_json(self):
        return {
            "label": self.label,
            "schedule": self.schedule,
            "stages": len(self.stages),
            "replicas": self.replicas,
            "microbatches": self.microbatches,
            "boundaries": self.boundaries,
            "deepspeed_parts": self.deepspeed_parts,
            "iteration_s": self.iteration_s,
            "samples_per_s": self.samples_per_s,
            "stage_s": [s.busy_s for s in self.stages],
            "stage_memory_bytes": [s.memory_bytes for s in self.stages],
        }


class CostModel:
    """Costs of any stage [i, j) at position s, for one (p, replicas, schedule, m) configuration."""

    def __init__(
        self, profile: Profile, cluster: Cluster, stages: int, microbatches: int, schedule: str, replicas: int = 1
    ):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule {schedule!r}: choose one of {SCHEDULES}")
        if stages < 1 or microbatches < 1 or replicas < 1:
            raise ValueError("stages, micro-batches and replicas must be at least 1")
        if stages > profile.num_layers:
            raise ValueError(
                f"{stages} stages but only {profile.num_layers} layers: a stage cannot be empty; "
                f"use at most {profile.num_layers} stages"
            )
        if stages * replicas > cluster.size:
            raise ValueError(
                f"{stages} stages x {replicas} replicas need {stages * replicas} devices, "
                f"cluster {cluster.name} has {cluster.size}"
            )
        self.profile, self.cluster = profile, cluster
        self.p, self.m, self.schedule, self.replicas = stages, microbatches, schedule, replicas
        layers = profile.layers
        self.L = len(layers)

        def prefix(values):
            return list(itertools.accumulate(values, initial=0.0))

        self._fwd = prefix(l.forward_s for l in layers)
        self._bwd = prefix(l.backward_s for l in layers)
        self._opt = prefix(l.optimizer_s for l in layers)
        self._params = prefix(l.param_bytes for l in layers)
        self._acts = prefix(l.activation_bytes for l in layers)
        self._out = [l.output_bytes for l in layers]
        # the slowest / smallest device among the replicas bounds each stage
        self.speed = [min(cluster.devices[r * stages + s].speed for r in range(replicas)) for s in range(stages)]
        self.memory = [
            min(cluster.devices[r * stages + s].memory_bytes for r in range(replicas)) for s in range(stages)
        ]
        self.state_per_param_byte = cluster.bytes_per_param_state / profile.param_dtype_bytes

    def in_flight(self, s):
        return self.m if self.schedule == "gpipe" else min(self.p - s, self.m)

    def memory_bytes(self, s, i, j):
        params = self._params[j] - self._params[i]
        return params * self.state_per_param_byte + self.in_flight(s) * (self._acts[j] - self._acts[i])

    def stage(self, s, i, j) -> Stage:
        speed = self.speed[s]
        link = self.cluster.link
        params = self._params[j] - self._params[i]
        return Stage(
            start=i,
            stop=j,
            forward_s=(self._fwd[j] - self._fwd[i]) / speed,
            backward_s=(self._bwd[j] - self._bwd[i]) / speed,
            send_forward_s=link.time(self._out[j - 1]) if s < self.p - 1 else 0.0,
            send_backward_s=link.time(self._out[i - 1]) if s > 0 else 0.0,
            step_s=(self._opt[j] - self._opt[i]) / speed
            + self.cluster.allreduce.ring_allreduce_time(params, self.replicas),
            static_bytes=params * self.state_per_param_byte,
            stash_bytes=self._acts[j] - self._acts[i],
            memory_bytes=self.memory_bytes(s, i, j),
            memory_limit=self.memory[s],
        )

    def label(self, stage: Stage):
        """(sum, max_a, max_b, max_step) contribution of one stage."""
        if self.schedule == "gpipe":
            a, b = stage.forward_s + stage.send_forward_s, stage.backward_s + stage.send_backward_s
            return (a + b, a, b, stage.step_s)
        return (stage.busy_s, stage.busy_s, 0.0, stage.step_s)

    def objective(self, label):
        total, max_a, max_b, max_step = label
        return total + (self.m - 1) * (max_a + max_b) + max_step

    def stages_for(self, boundaries):
        cuts = list(boundaries) + [self.L]
        return [self.stage(s, cuts[s], cuts[s + 1]) for s in range(self.p)]

    def plan(self, boundaries, label="planned", check_memory=True) -> Plan:
        bad = [b for b in zip(list(boundaries) + [self.L], list(boundaries)[1:] + [self.L + 1]) if b[0] >= b[1]]
        if len(boundaries) != self.p or boundaries[0] != 0 or bad:
            raise ValueError(
                f"boundaries {list(boundaries)} must be {self.p} rising first-layer indices from 0 "
                f"below {self.L} (no empty stage)"
            )
        stages = self.stages_for(boundaries)
        total = [0.0, 0.0, 0.0, 0.0]
        for st in stages:
            lab = self.label(st)
            total = [total[0] + lab[0]] + [max(x, y) for x, y in zip(total[1:], lab[1:])]
        plan = Plan(
            self.schedule,
            self.m,
            self.replicas,
            stages,
            self.objective(total),
            micro_batch=self.profile.micro_batch,
            label=label,
        )
        plan.notes["fits_memory"] = all(st.memory_bytes <= st.memory_limit for st in stages)
        return plan


def _combine(acc, lab):
    return (acc[0] + lab[0], max(acc[1], lab[1]), max(acc[2], lab[2]), max(acc[3], lab[3]))


def _pareto(labels):
    """Keep the labels no other label beats in every component."""
    labels.sort(key=lambda e: e[0])
    kept = []
    for entry in labels:
        v = entry[0]
        if not any(all(k[0][c] <= v[c] for c in range(4)) for k in kept):
            kept.append(entry)
    return kept


def optimal_plan(model: CostModel) -> Plan:
    """Exact minimum of the iteration time over contiguous, non-empty, memory-feasible partitions."""
    p, L = model.p, model.L
    # states[s][j]: labels for stages 0..s covering layers [0, j); entry = (label, i, parent entry)
    states = [dict() for _ in range(p)]
    for j in range(1, L - p + 2):
        if model.memory_bytes(0, 0, j) <= model.memory[0]:
            states[0][j] = [(model.label(model.stage(0, 0, j)), 0, None)]
    for s in range(1, p):
        last = L - (p - 1 - s)
        for j in range(s + 1, last + 1):
            if s == p - 1 and j != L:
                continue
            candidates = []
            for i, entries in states[s - 1].items():
                if i >= j or model.memory_bytes(s, i, j) > model.memory[s]:
                    continue
                lab = model.label(model.stage(s, i, j))
                candidates += [(_combine(e[0], lab), i, e) for e in entries]
            if candidates:
                states[s][j] = _pareto(candidates)
    finals = states[p - 1].get(L)
    if not finals:
        raise infeasible(model)
    best = min(finals, key=lambda e: model.objective(e[0]))
    boundaries, entry = [], best
    for _ in range(p):
        boundaries.append(entry[1] if entry[2] is not None else 0)
        entry = entry[2]
    return model.plan(boundaries[::-1])


def infeasible(model: CostModel) -> InfeasibleError:
    """The smallest per-device memory that fits some partition: a min-max DP over stage memory."""
    p, L = model.p, model.L
    best = {(0, j): model.memory_bytes(0, 0, j) for j in range(1, L + 1)}
    for s in range(1, p):
        for j in range(s + 1, L + 1):
            best[(s, j)] = min(max(best[(s - 1, i)], model.memory_bytes(s, i, j)) for i in range(s, j))
    needed = best[(p - 1, L)]
    have = min(model.memory)
    return InfeasibleError(
        f"no partition of {L} layers into {p} stages ({model.schedule}, {model.m} micro-batches) fits in memory: "
        f"the smallest device memory that would fit is {needed / 2**30:.3f} GiB ({needed:.0f} bytes), "
        f"the cluster gives {have / 2**30:.3f} GiB; use more stages, fewer micro-batches, 1f1b, "
        f"or devices with more memory",
        needed,
    )


def brute_force_plan(model: CostModel) -> Plan:
    """Every partition, for checking the DP on small instances."""
    best = None
    for cuts in itertools.combinations(range(1, model.L), model.p - 1):
        plan = model.plan((0,) + cuts)
        if plan.notes["fits_memory"] and (best is None or plan.iteration_s < best.iteration_s):
            best = plan
    if best is None:
        raise infeasible(model)
    return best


def deepspeed_parts(profile: Profile, stages: int, method: str):
    """The boundaries DeepSpeed's ``PipelineModule`` picks with ``partition_method=method``."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # keep DeepSpeed's import banner out of --json output
        from deepspeed.runtime import utils as ds_utils  # DeepSpeed's own functions, not a copy
    if method == "uniform":
        parts = ds_utils.partition_uniform(num_items=profile.num_layers, num_parts=stages)
    elif method == "parameters":
        counts = [round(l.param_bytes / profile.param_dtype_bytes) for l in profile.layers]
        parts = ds_utils.partition_balanced(weights=counts, num_parts=stages)
    else:
        raise ValueError(f"DeepSpeed method {method!r}: compare against 'uniform' or 'parameters'")
    return [int(v) for v in parts]


def baseline_plan(model: CostModel, method: str) -> Plan:
    parts = deepspeed_parts(model.profile, model.p, method)
    if any(a >= b for a, b in zip(parts, parts[1:])):  # DeepSpeed leaves a stage empty here
        return None
    return model.plan(parts[:-1], label=method)


def data_parallel_plan(profile: Profile, cluster: Cluster, devices: int, microbatches_per_device: int) -> Plan:
    """Pure data parallelism: every device holds the whole model and runs its micro-batches one
    after another (gradient accumulation frees activations between them), then all-reduces."""
    model = CostModel(profile, cluster, 1, microbatches_per_device, "gpipe", replicas=devices)
    stage = model.stage(0, 0, model.L)
    stage.memory_bytes = stage.static_bytes + stage.stash_bytes  # one micro-batch at a time
    time = model.m * (stage.forward_s + stage.backward_s) + stage.step_s
    plan = Plan(
        "data-parallel", model.m, devices, [stage], time, micro_batch=profile.micro_batch, label="data-parallel"
    )
    plan.notes["fits_memory"] = stage.memory_bytes <= stage.memory_limit
    return plan


def search(profile: Profile, cluster: Cluster, max_microbatches: int = 64, stage_counts=None):
    """Best plan over stage count p (dividing the device count; p = 1 is data parallelism),
    schedule and micro-batches per pipeline (powers of two up to ``max_microbatches`` samples'
    worth of micro-batches per iteration), by samples per second. Returns (best, all feasible)."""
    n = cluster.size
    counts = stage_counts or [p for p in range(1, min(n, profile.num_layers) + 1) if n % p == 0]
    tried = []
    for p in counts:
        d = n // p
        ms = sorted({m for m in (2**k for k in range(12)) if m * d <= max_microbatches} | {max_microbatches // d})
        for m in [m for m in ms if m >= 1]:
            if p == 1:
                plan = data_parallel_plan(profile, cluster, d, m)
                if plan.notes["fits_memory"]:
                    tried.append(plan)
                continue
            for schedule in SCHEDULES:
                try:
                    tried.append(optimal_plan(CostModel(profile, cluster, p, m, schedule, replicas=d)))
                except InfeasibleError:
                    pass
    if not tried:
        raise InfeasibleError(
            f"no configuration of {profile.model} fits cluster {cluster.name}'s memory; use devices with more memory",
            math.inf,
        )
    return max(tried, key=lambda pl: pl.samples_per_s), tried
