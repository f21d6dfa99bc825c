"""Per-layer profiler: forward and backward time, parameter, stashed-activation and output bytes.

Each layer is timed on its own, fed with the real output of the layers before it, so the numbers
add up to a stage's cost for any contiguous partition. Times are medians over the repeats of the
thread's CPU time (one thread, the default), so other work on a shared machine does not inflate them. The last layer's numbers include the loss,
because the last pipeline stage computes it. Stashed bytes are what autograd saves for backward
(parameters excluded), counted once per storage.
"""

import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from .models import LayerStack

REQUIRED_FIELDS = ("name", "forward_s", "backward_s", "param_bytes", "activation_bytes", "output_bytes")


@dataclass
class LayerProfile:
    name: str
    forward_s: float
    backward_s: float
    param_bytes: int
    activation_bytes: int  # stashed per micro-batch until its backward
    output_bytes: int  # sent to the next stage per micro-batch
    optimizer_s: float = 0.0  # one optimizer step on this layer's parameters (optional)


@dataclass
class Profile:
    layers: list
    model: str = "unknown"
    micro_batch: int = 1
    param_dtype_bytes: int = 4  # bytes of one parameter, to count parameters from param_bytes
    notes: dict = field(default_factory=dict)

    @property
    def num_layers(self):
        return len(self.layers)

    def save(self, path):
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    @staticmethod
    def load(path) -> "Profile":
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read profile {path}: {err}; write one with `python -m bapipe profile`") from err
        return Profile.from_dict(raw, source=str(path))

    @staticmethod
    def from_dict(raw, source="profile") -> "Profile":
        if not isinstance(raw, dict) or not isinstance(raw.get("layers"), list) or not raw["layers"]:
            raise ValueError(f"{source}: a profile is a JSON object with a non-empty `layers` list")
        layers = []
        for i, entry in enumerate(raw["layers"]):
            missing = [k for k in REQUIRED_FIELDS if k not in entry]
            if missing:
                raise ValueError(f"{source}: layer {i} lacks {missing}; each layer needs {list(REQUIRED_FIELDS)}")
            numbers = {k: entry[k] for k in REQUIRED_FIELDS[1:]}
            bad = [k for k, v in numbers.items() if not isinstance(v, (int, float)) or v < 0]
            if bad:
                raise ValueError(f"{source}: layer {i} ({entry['name']}) has negative or non-numeric {bad}")
            layers.append(
                LayerProfile(name=str(entry["name"]), optimizer_s=float(entry.get("optimizer_s", 0.0)), **numbers)
            )
        return Profile(
            layers=layers,
            model=raw.get("model", "unknown"),
            micro_batch=raw.get("micro_batch", 1),
            param_dtype_bytes=raw.get("param_dtype_bytes", 4),
            notes=raw.get("notes", {}),
        )


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _detach_for_grad(value):
    """A fresh leaf per floating tensor, as a pipeline stage receives its input."""
    if isinstance(value, torch.Tensor):
        value = value.detach().clone()
        return value.requires_grad_(True) if value.is_floating_point() else value
    return type(value)(_detach_for_grad(v) for v in value)


def _median_time(fn, repeats, clock):
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def _stashed_bytes(layer, x, loss):
    """Bytes autograd keeps for backward during one forward, parameters excluded."""
    params = {p.data_ptr() for p in layer.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _forward(layer, x, loss)
    return sum(seen.values())


def _forward(layer, x, loss):
    """One layer's forward on a fresh copy of its input, as a pipeline stage receives it."""
    out = layer(_detach_for_grad(x))
    return loss(out) if loss else out


def _time_layer(layer, x, loss, repeats, clock) -> dict:
    """Median forward, backward and optimizer-step seconds of one layer on input x."""
    layer.train()
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-4) if any(True for _ in layer.parameters()) else None

    def forward_backward():
        layer.zero_grad(set_to_none=True)
        outs = [t for t in _tensors(_forward(layer, x, loss)) if t.requires_grad]
        grads = [torch.ones_like(t) if t.dim() == 0 else torch.randn_like(t) for t in outs]
        start = clock()
        torch.autograd.backward(outs, grads)
        return clock() - start

    forward_backward()  # warm-up: allocator, kernels, lazy state
    return {
        "forward_s": _median_time(lambda: _forward(layer, x, loss), repeats, clock),
        "backward_s": statistics.median(forward_backward() for _ in range(repeats)),
        "optimizer_s": _median_time(optimizer.step, repeats, clock) if optimizer else 0.0,
    }


def profile_stack(stack: LayerStack, micro_batch: int, repeats: int = 5, threads: int = 1) -> Profile:
    """Measure every layer of ``stack`` at ``micro_batch`` samples on this machine's CPU."""
    if micro_batch < 1 or repeats < 1:
        raise ValueError("micro_batch and repeats must be at least 1")
    torch.set_num_threads(threads)
    # With one thread every op, backward included, runs on this thread, so its CPU time is the
    # time a dedicated core would take, however busy the machine is. More threads: wall time.
    clock = time.thread_time if threads == 1 else time.perf_counter
    inputs, labels = stack.make_batch(micro_batch)
    last = len(stack.layers) - 1
    result = []
    x = inputs
    for i, layer in enumerate(stack.layers):
        loss = (lambda out: stack.loss_fn(out, labels)) if i == last else None  # the last stage computes it
        times = _time_layer(layer, x, loss, repeats, clock)
        activation_bytes = _stashed_bytes(layer, x, loss)
        with torch.no_grad():
            x = layer(x)
        result.append(
            LayerProfile(
                name=f"{i}:{layer.__class__.__name__}",
                **times,
                param_bytes=sum(p.numel() * p.element_size() for p in layer.parameters()),
                activation_bytes=activation_bytes,
                output_bytes=0 if i == last else sum(t.numel() * t.element_size() for t in _tensors(x)),
            )
        )
    return Profile(
        layers=result,
        model=stack.name,
        micro_batch=micro_batch,
        notes={
            "threads": threads,
            "repeats": repeats,
            "device": "cpu",
            "clock": "thread CPU time" if threads == 1 else "wall",
        },
    )
