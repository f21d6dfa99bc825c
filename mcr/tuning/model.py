"""The performance model: latency = α + β·bytes per (op, candidate, group size).

Fitted to the measurements by least squares on the *relative* error (latencies span six orders
of magnitude; an absolute fit would only see the largest sizes). Used two ways:
  - between measured sizes, the two neighbouring points define a local α-β line, which places
    the crossover where the winner changes (`rules.crossover`);
  - for another group size, α and β are scaled by how the textbook algorithms grow with the
    group: α by the number of steps (log2 n for tree/recursive doubling, n-1 for all-to-all,
    1 for a point-to-point message) and β by nccl-tests' bus factor (2(n-1)/n for all-reduce,
    (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 otherwise). Each measured latency
    is multiplied by the ratio the model gives, so the curve keeps its measured shape
    (protocol switches, cache effects) and only its scale moves. It assumes the same links: a
    table from one node says nothing about a network it never crossed.
"""

from __future__ import annotations

import copy
import math

from ..ops import bus_factor
from .rules import DEFAULT_MARGIN, entries_for, entry_dtype
from .table import Curve, Fit, TuningTable, TuningTableError

MiB = 1 << 20


def fit(sizes, latencies) -> tuple:
    """(α, β) with α, β >= 0 minimising Σ((α + β·s - t) / t)², for points with t > 0."""
    pts = [(float(s), float(t)) for s, t in zip(sizes, latencies) if t is not None and t > 0]
    if not pts:
        raise ValueError("no measured points to fit")
    if len(pts) == 1:
        return pts[0][1], 0.0
    # weighted normal equations with w = 1/t²: [Σw Σws; Σws Σws²] [α β]ᵀ = [Σwt Σwst]ᵀ
    sw = sum(1 / t**2 for s, t in pts)
    sws = sum(s / t**2 for s, t in pts)
    swss = sum(s * s / t**2 for s, t in pts)
    swt = sum(1 / t for s, t in pts)
    swst = sum(s / t for s, t in pts)
    det = sw * swss - sws * sws
    if det > 0:
        alpha = (swt * swss - swst * sws) / det
        beta = (sw * swst - sws * swt) / det
        if alpha >= 0 and beta >= 0:
            return alpha, beta
    # the unconstrained optimum has a negative term: best fit with that term at zero
    only_alpha = swt / sw
    only_beta = swst / swss
    err_a = sum(((only_alpha - t) / t) ** 2 for s, t in pts)
    err_b = sum(((only_beta * s - t) / t) ** 2 for s, t in pts)
    return (only_alpha, 0.0) if err_a <= err_b else (0.0, only_beta)


def steps(op: str, n: int) -> float:
    """How the latency term grows with the group size n."""
    if op == "send_recv":
        return 1.0
    if op == "all_to_all":
        return float(n - 1)
    return float(math.ceil(math.log2(n))) if n > 1 else 0.0


def fits_for(curve: Curve) -> list:
    out = []
    for cand, lat in curve.latency_us.items():
        sizes = [s for s, t in zip(curve.bytes, lat) if t is not None]
        if not sizes:
            continue
        alpha, beta = fit(sizes, [t for t in lat if t is not None])
        out.append(Fit(curve.op, curve.group_size, cand, round(alpha, 4), round(beta * MiB, 4), curve.predicted))
    return out


def predict_curve(curve: Curve, group_size: int) -> Curve:
    """The curve at another group size: each point times the model's ratio between sizes."""
    g, n, op = curve.group_size, group_size, curve.op
    if g < 2 or n < 2:
        raise ValueError(f"can only predict between group sizes of 2 or more (asked {g} -> {n})")
    a_ratio = steps(op, n) / steps(op, g)
    b_ratio = bus_factor(op, n) / bus_factor(op, g)
    latency = {}
    for f in fits_for(curve):
        beta = f.beta_us_per_MiB / MiB
        scaled = []
        for s, t in zip(curve.bytes, curve.latency_us[f.candidate]):
            if t is None:
                scaled.append(None)
                continue
            here = f.alpha_us + beta * s
            there = f.alpha_us * a_ratio + beta * s * b_ratio
            scaled.append(round(t * there / here, 3) if here > 0 else t)
        latency[f.candidate] = scaled
    return Curve(op, n, curve.dtype, list(curve.bytes), latency, predicted=True)


def _source(curves, op, dtype, n):
    """The measured curve to predict group size n from: the largest group below n, else the smallest above."""
    mine = [c for c in curves if c.op == op and c.dtype == dtype and not c.predicted]
    below = [c for c in mine if c.group_size <= n]
    if below:
        return max(below, key=lambda c: c.group_size)
    return min(mine, key=lambda c: c.group_size)


def predict_table(
    table: TuningTable, world_size: int, ranks_per_node=None, margin: float = DEFAULT_MARGIN, nodes=None
) -> TuningTable:
    """The table for a job of `world_size` ranks: measured entries of group sizes that exist in
    the table are kept; the group of `world_size` gets entries predicted by the model. The
    model scales group sizes only: a table from one node used on several (tuning_predict) keeps
    its one-node choices."""
    if table.fingerprint.get("world_size") in (None, world_size):
        return table
    measured_sizes = {c.group_size for c in table.curves if not c.predicted}
    if not table.curves:
        raise TuningTableError(
            f"tuning table {table.path} has no measured curves to predict from; write it with `python -m mcr.tools.tune`"
        )
    fp = copy.deepcopy(table.fingerprint)
    if world_size in measured_sizes:
        fp["world_size"] = world_size
        return TuningTable(fp, list(table.entries), table.path, list(table.curves), list(table.model))
    fp["predicted_from"] = {"world_size": fp.get("world_size"), "ranks_per_node": fp.get("ranks_per_node")}
    fp["world_size"] = world_size
    if ranks_per_node is not None:
        fp["ranks_per_node"] = ranks_per_node
    if nodes is not None:
        fp["nodes"] = nodes
    keys = sorted({(c.op, c.dtype) for c in table.curves if not c.predicted})
    new_curves = [predict_curve(_source(table.curves, op, dtype, world_size), world_size) for op, dtype in keys]
    entries = [e for e in table.entries if e.group_size != world_size]
    curves = [c for c in table.curves if c.group_size != world_size]
    model = [m for m in table.model if m.group_size != world_size]
    for curve in new_curves:
        entries += entries_for(curve, margin, dtype=entry_dtype(curve, new_curves))
        model += fits_for(curve)
    return TuningTable(fp, entries, table.path, curves + new_curves, model)
