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
any completion is monotone in each, so a dominated cost vector can never win and the result is
exact. That is O(p * L^2) transitions times the size of the Pareto sets, which stay small: at
most 59 vectors and 0.13 s per configuration on the study's profiles (8 stages, 11-18 layers).
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
        self.stages, self.microbatches, self.schedule, self.replicas = stages, microbatches, schedule, replicas
        layers = profile.layers
        self.num_layers = len(layers)

        def prefix(field):  # prefix sums: a stage [i, j) costs prefix[j] - prefix[i]
            return list(itertools.accumulate((getattr(layer, field) for layer in layers), initial=0.0))

        self._forward = prefix("forward_s")
        self._backward = prefix("backward_s")
        self._optimizer = prefix("optimizer_s")
        self._params = prefix("param_bytes")
        self._stash = prefix("activation_bytes")
        self._output = [layer.output_bytes for layer in layers]
        # the slowest / smallest device among the replicas bounds each stage
        self.speed = [min(cluster.devices[r * stages + s].speed for r in range(replicas)) for s in range(stages)]
        self.memory = [
            min(cluster.devices[r * stages + s].memory_bytes for r in range(replicas)) for s in range(stages)
        ]
        self.state_per_param_byte = cluster.bytes_per_param_state / profile.param_dtype_bytes

    def in_flight(self, s):
        return self.microbatches if self.schedule == "gpipe" else min(self.stages - s, self.microbatches)

    def memory_bytes(self, s, i, j):
        params = self._params[j] - self._params[i]
        return params * self.state_per_param_byte + self.in_flight(s) * (self._stash[j] - self._stash[i])

    def stage(self, s, i, j) -> Stage:
        speed = self.speed[s]
        link = self.cluster.link
        params = self._params[j] - self._params[i]
        return Stage(
            start=i,
            stop=j,
            forward_s=(self._forward[j] - self._forward[i]) / speed,
            backward_s=(self._backward[j] - self._backward[i]) / speed,
            send_forward_s=link.time(self._output[j - 1]) if s < self.stages - 1 else 0.0,
            send_backward_s=link.time(self._output[i - 1]) if s > 0 else 0.0,
            step_s=(self._optimizer[j] - self._optimizer[i]) / speed
            + self.cluster.allreduce.ring_allreduce_time(params, self.replicas),
            static_bytes=params * self.state_per_param_byte,
            stash_bytes=self._stash[j] - self._stash[i],
            memory_bytes=self.memory_bytes(s, i, j),
            memory_limit=self.memory[s],
        )

    def cost_vector(self, stage: Stage):
        """One stage's (sum, max_a, max_b, max_step) terms of the iteration time."""
        if self.schedule == "gpipe":
            forward = stage.forward_s + stage.send_forward_s
            backward = stage.backward_s + stage.send_backward_s
            return (forward + backward, forward, backward, stage.step_s)
        return (stage.busy_s, stage.busy_s, 0.0, stage.step_s)

    def iteration_s(self, costs):
        """The iteration time from the stages' combined cost vector."""
        total, max_a, max_b, max_step = costs
        return total + (self.microbatches - 1) * (max_a + max_b) + max_step

    def stages_for(self, boundaries):
        cuts = list(boundaries) + [self.num_layers]
        return [self.stage(s, cuts[s], cuts[s + 1]) for s in range(self.stages)]

    def plan(self, boundaries, label="planned") -> Plan:
        cuts = list(boundaries) + [self.num_layers]
        if len(boundaries) != self.stages or boundaries[0] != 0 or any(a >= b for a, b in zip(cuts, cuts[1:])):
            raise ValueError(
                f"boundaries {list(boundaries)} must be {self.stages} rising first-layer indices from 0 "
                f"below {self.num_layers} (no empty stage)"
            )
        stages = self.stages_for(boundaries)
        costs = (0.0, 0.0, 0.0, 0.0)
        for stage in stages:
            costs = _combine(costs, self.cost_vector(stage))
        plan = Plan(
            self.schedule,
            self.microbatches,
            self.replicas,
            stages,
            self.iteration_s(costs),
            micro_batch=self.profile.micro_batch,
            label=label,
        )
        plan.notes["fits_memory"] = all(stage.memory_bytes <= stage.memory_limit for stage in stages)
        return plan


def _combine(costs, stage_costs):
    """Cost vectors of consecutive stages: times add, maxima take the larger."""
    return (
        costs[0] + stage_costs[0],
        max(costs[1], stage_costs[1]),
        max(costs[2], stage_costs[2]),
        max(costs[3], stage_costs[3]),
    )


def _pareto(entries):
    """Keep the entries whose cost vector no other entry's beats in every component."""
    entries.sort(key=lambda entry: entry[0])
    kept = []
    for entry in entries:
        costs = entry[0]
        if not any(all(other[0][c] <= costs[c] for c in range(4)) for other in kept):
            kept.append(entry)
    return kept


def optimal_plan(model: CostModel) -> Plan:
    """Exact minimum of the iteration time over contiguous, non-empty, memory-feasible partitions."""
    stages, layers = model.stages, model.num_layers
    # states[s][j]: entries for stages 0..s covering layers [0, j); entry = (costs, i, parent entry)
    states = [dict() for _ in range(stages)]
    for j in range(1, layers - stages + 2):
        if model.memory_bytes(0, 0, j) <= model.memory[0]:
            states[0][j] = [(model.cost_vector(model.stage(0, 0, j)), 0, None)]
    for s in range(1, stages):
        last = layers - (stages - 1 - s)
        for j in range(s + 1, last + 1):
            if s == stages - 1 and j != layers:
                continue
            candidates = []
            for i, entries in states[s - 1].items():
                if i >= j or model.memory_bytes(s, i, j) > model.memory[s]:
                    continue
                stage_costs = model.cost_vector(model.stage(s, i, j))
                candidates += [(_combine(entry[0], stage_costs), i, entry) for entry in entries]
            if candidates:
                states[s][j] = _pareto(candidates)
    finals = states[stages - 1].get(layers)
    if not finals:
        raise infeasible(model)
    best = min(finals, key=lambda entry: model.iteration_s(entry[0]))
    boundaries, entry = [], best
    for _ in range(stages):
        boundaries.append(entry[1] if entry[2] is not None else 0)
        entry = entry[2]
    return model.plan(boundaries[::-1])


def infeasible(model: CostModel) -> InfeasibleError:
    """The smallest per-device memory that fits some partition: a min-max DP over stage memory."""
    stages, layers = model.stages, model.num_layers
    best = {(0, j): model.memory_bytes(0, 0, j) for j in range(1, layers + 1)}
    for s in range(1, stages):
        for j in range(s + 1, layers + 1):
            best[(s, j)] = min(max(best[(s - 1, i)], model.memory_bytes(s, i, j)) for i in range(s, j))
    needed = best[(stages - 1, layers)]
    have = min(model.memory)
    return InfeasibleError(
        f"no partition of {layers} layers into {stages} stages ({model.schedule}, {model.microbatches} micro-batches) "
        f"fits in memory: "
        f"the smallest device memory that would fit is {needed / 2**30:.3f} GiB ({needed:.0f} bytes), "
        f"the cluster gives {have / 2**30:.3f} GiB; use more stages, fewer micro-batches, 1f1b, "
        f"or devices with more memory",
        needed,
    )


def brute_force_plan(model: CostModel) -> Plan:
    """Every partition, for checking the DP on small instances."""
    best = None
    for cuts in itertools.combinations(range(1, model.num_layers), model.stages - 1):
        plan = model.plan((0,) + cuts)
        if plan.notes["fits_memory"] and (best is None or plan.iteration_s < best.iteration_s):
            best = plan
    if best is None:
        raise infeasible(model)
    return best


def deepspeed_partition(profile: Profile, stages: int, method: str):
    """The ``parts`` DeepSpeed's ``PipelineModule`` picks with ``partition_method=method``."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # keep DeepSpeed's import banner out of --json output
        from deepspeed.runtime import utils as ds_utils  # DeepSpeed's own functions, not a copy
    if method == "uniform":
        parts = ds_utils.partition_uniform(num_items=profile.num_layers, num_parts=stages)
    elif method == "parameters":
        counts = [round(layer.param_bytes / profile.param_dtype_bytes) for layer in profile.layers]
        parts = ds_utils.partition_balanced(weights=counts, num_parts=stages)
    else:
        raise ValueError(f"DeepSpeed method {method!r}: compare against 'uniform' or 'parameters'")
    return [int(v) for v in parts]


def baseline_plan(model: CostModel, method: str) -> Plan:
    parts = deepspeed_partition(model.profile, model.stages, method)
    if any(a >= b for a, b in zip(parts, parts[1:])):  # DeepSpeed leaves a stage empty here
        return None
    return model.plan(parts[:-1], label=method)


def data_parallel_plan(profile: Profile, cluster: Cluster, devices: int, microbatches_per_device: int) -> Plan:
    """Pure data parallelism: every device holds the whole model and runs its micro-batches one
    after another (gradient accumulation frees activations between them), then all-reduces."""
    model = CostModel(profile, cluster, 1, microbatches_per_device, "gpipe", replicas=devices)
    stage = model.stage(0, 0, model.num_layers)
    stage.memory_bytes = stage.static_bytes + stage.stash_bytes  # one micro-batch at a time
    iteration_s = model.microbatches * (stage.forward_s + stage.backward_s) + stage.step_s
    plan = Plan(
        "data-parallel",
        model.microbatches,
        devices,
        [stage],
        iteration_s,
        micro_batch=profile.micro_batch,
        label="data-parallel",
    )
    plan.notes["fits_memory"] = stage.memory_bytes <= stage.memory_limit
    return plan


def search(profile: Profile, cluster: Cluster, max_microbatches: int = 64, stage_counts=None):
    """Best plan over stage count p (dividing the device count; p = 1 is data parallelism),
    schedule and micro-batches per pipeline (powers of two up to ``max_microbatches`` samples'
    worth of micro-batches per iteration), by samples per second. Returns (best, all feasible)."""
    devices = cluster.size
    counts = stage_counts or [p for p in range(1, min(devices, profile.num_layers) + 1) if devices % p == 0]
    tried = []
    for stages in counts:
        replicas = devices // stages
        powers = {2**k for k in range(12) if 2**k * replicas <= max_microbatches}
        for microbatches in sorted(m for m in powers | {max_microbatches // replicas} if m >= 1):
            if stages == 1:
                plan = data_parallel_plan(profile, cluster, replicas, microbatches)
                if plan.notes["fits_memory"]:
                    tried.append(plan)
                continue
            for schedule in SCHEDULES:
                try:
                    model = CostModel(profile, cluster, stages, microbatches, schedule, replicas=replicas)
                    tried.append(optimal_plan(model))
                except InfeasibleError:
                    pass
    if not tried:
        raise InfeasibleError(
            f"no configuration of {profile.model} fits cluster {cluster.name}'s memory; use devices with more memory",
            math.inf,
        )
    return max(tried, key=lambda plan: plan.samples_per_s), tried
