"""From measured curves to table entries: who wins at each size, where the winner changes, and
which adjacent ranges merge.

Rules (all deterministic, so every rank given the same agreed timings writes the same table):
  - margin: a candidate takes over from the current winner only when it is faster by more than
    `margin` (a fraction); on noise the current winner stays. The first size starts with the
    preferred candidate (the runtime's built-in order) as the current winner.
  - boundaries: where the winner changes between two measured sizes, the boundary is the
    crossover of the two candidates' α-β lines through those two points; the stretch from the
    crossover to the next measured size is marked `predicted` (the model decided it).
  - merge: adjacent ranges with the same choice and the same `predicted` flag become one entry.
"""

from __future__ import annotations

from .candidates import parse_label
from .table import Curve, Entry

DEFAULT_MARGIN = 0.05


def pick(latency: dict, incumbent, margin: float, order) -> str:
    """The winner among measured candidates (`latency`: label -> µs or None). The incumbent
    keeps the place unless another candidate beats it by more than `margin`."""
    measured = {c: t for c, t in latency.items() if t is not None}
    if not measured:
        raise ValueError("no candidate was measured at this size")
    rank = {c: i for i, c in enumerate(order)}
    best = min(measured, key=lambda c: (measured[c], rank.get(c, len(rank))))
    if incumbent in measured and measured[incumbent] <= measured[best] * (1 + margin):
        return incumbent
    return best


def winners(curve: Curve, margin: float, order=None) -> list:
    """The winning label at each measured size of the curve, walking up in size."""
    order = list(order or curve.latency_us)
    out, current = [], None
    for i in range(len(curve.bytes)):
        latency = {c: curve.latency_us[c][i] for c in curve.latency_us}
        if current is None or latency.get(current) is None:
            current = next((c for c in order if latency.get(c) is not None), None)
        current = pick(latency, current, margin, order)
        out.append(current)
    return out


def _lerp(x0, x1, y0, y1, x):
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def crossover(s0: int, s1: int, a: list, b: list) -> int:
    """Where line a (through (s0, a[0]), (s1, a[1])) meets line b, within (s0, s1]; s1 when
    they do not cross there or a point is missing."""
    if None in (a[0], a[1], b[0], b[1]):
        return s1
    d0, d1 = a[0] - b[0], a[1] - b[1]
    if not (d0 < 0 < d1):
        return s1
    return max(s0 + 1, min(s1, int(round(s0 + (s1 - s0) * (-d0) / (d1 - d0)))))


def _point_latency(curve, i):
    return {c: round(v[i], 3) for c, v in curve.latency_us.items() if v[i] is not None}


def _interpolated_latency(curve, i, at):
    s0, s1 = curve.bytes[i], curve.bytes[i + 1]
    out = {}
    for c, v in curve.latency_us.items():
        if v[i] is not None and v[i + 1] is not None:
            out[c] = round(_lerp(s0, s1, v[i], v[i + 1], at), 3)
    return out


def entry_dtype(curve: Curve, curves) -> str:
    """The dtype a curve's entries speak for: `any`, unless its op was also measured in another
    dtype (`mcr.tools.tune --dtype bfloat16 --add-to TABLE`) and this curve is not the float32 one."""
    others = {c.dtype for c in curves if c.op == curve.op and c.group_size == curve.group_size}
    return "any" if len(others) == 1 or curve.dtype == "float32" else curve.dtype


def entries_for(curve: Curve, margin: float = DEFAULT_MARGIN, order=None, dtype: str = "any") -> list:
    """Merged table entries for one curve. Sizes between measured points go to the winner of
    the point below, up to the crossover when the next point has another winner."""
    if not curve.bytes:
        return []
    wins = winners(curve, margin, order)
    pieces = []  # (low, high, label, predicted, latency_us, at_bytes)
    low = 0
    sizes = curve.bytes
    for i, size in enumerate(sizes):
        if i + 1 == len(sizes):
            pieces.append((low, None, wins[i], curve.predicted, _point_latency(curve, i), size))
            break
        nxt = sizes[i + 1]
        if wins[i + 1] == wins[i]:
            pieces.append((low, nxt, wins[i], curve.predicted, _point_latency(curve, i), size))
        else:
            a, b = curve.latency_us[wins[i]], curve.latency_us[wins[i + 1]]
            cut = crossover(size, nxt, a[i : i + 2], b[i : i + 2])
            pieces.append((low, cut, wins[i], curve.predicted, _point_latency(curve, i), size))
            if cut < nxt:
                pieces.append((cut, nxt, wins[i + 1], True, _interpolated_latency(curve, i, cut), cut))
        low = nxt
    merged = []
    for low, high, lab, predicted, latency, at in pieces:
        last = merged[-1] if merged else None
        if last is not None and last[2] == lab and last[3] == predicted:
            merged[-1] = (last[0], high, lab, predicted, latency, at)
        else:
            merged.append((low, high, lab, predicted, latency, at))
    out = []
    for low, high, lab, predicted, latency, at in merged:
        choice = parse_label(lab)
        out.append(
            Entry(
                op=curve.op,
                group_size=curve.group_size,
                min_bytes=low,
                max_bytes=high,
                backend=choice.backend,
                dtype=dtype,
                chunk_bytes=choice.chunk_bytes,
                inter=choice.inter,  # a node-aware winner (node:INTRA+INTER): both phases' backends
                host=choice.host,  # a staged winner (BACKEND/host)
                predicted=predicted,
                latency_us=latency,
                latency_at_bytes=at,
            )
        )
    return out
