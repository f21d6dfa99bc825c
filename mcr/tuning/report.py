"""Showing a tuning table: a text summary, PNG plots per op and a short Markdown report.

Plots: latency and bus bandwidth versus message size, one line per candidate, with the chosen
envelope (the latency of the table's choice at each measured size) drawn over them.
"""

from __future__ import annotations

import os
import sys

from ..commlog import human_bytes
from ..ops import bus_factor
from .candidates import label


def _range(e) -> str:
    high = "∞" if e.max_bytes is None else human_bytes(e.max_bytes)
    return f"[{human_bytes(e.min_bytes)}, {high})"


def _device(fingerprint) -> str:
    """` (cuda tensors, NVIDIA H100 ...)` for a table of another device than the CPU; '' for a CPU one."""
    if fingerprint.get("device", "cpu") == "cpu":
        return ""
    gpu = f", {fingerprint['gpu']}" if fingerprint.get("gpu") else ""
    return f" ({fingerprint['device']} tensors{gpu})"


def _groups(table):
    keys = []
    for e in table.entries:
        if (e.op, e.group_size) not in keys:
            keys.append((e.op, e.group_size))
    return keys


def summary(table, group_size=None) -> str:
    """One block per (op, group size): each size range, its choice and every candidate's latency
    (only the blocks of `group_size` when given)."""
    lines = []
    fp = table.fingerprint
    origin = f", predicted from {fp['predicted_from']['world_size']} ranks" if fp.get("predicted_from") else ""
    lines.append(f"tuning table for {fp.get('world_size')} ranks on {fp.get('hostname')!r}{_device(fp)}{origin}")
    for op, size in _groups(table):
        if group_size is not None and size != group_size:
            continue
        lines.append(f"\n# {op}, group of {size}")
        lines.append(f"{'bytes':<31}{'choice':<18}{'':<11}latency us at the largest measured size")
        for e in (e for e in table.entries if (e.op, e.group_size) == (op, size)):
            lat = ", ".join(f"{c} {t:g}" for c, t in sorted(e.latency_us.items(), key=lambda kv: kv[1]))
            at = f" @{human_bytes(e.latency_at_bytes)}" if e.latency_at_bytes is not None else ""
            sizes = _range(e) + ("" if e.dtype == "any" else f" {e.dtype}")
            lines.append(f"{sizes:<31}{label(e.choice):<18}{'predicted' if e.predicted else '':<11}{lat}{at}")
    return "\n".join(lines)


def chosen_latency(table, curve) -> list:
    """The latency of the table's choice at each measured size of the curve (the envelope)."""
    out = []
    for i, s in enumerate(curve.bytes):
        choice = table.lookup(curve.op, s, curve.group_size, curve.dtype)  # falls back to `any` itself
        out.append(None if choice is None else curve.latency_us.get(label(choice), [None] * len(curve.bytes))[i])
    return out


def write_plots(table, directory: str) -> list:
    """One PNG per (op, group size) curve; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    paths = []
    for curve in table.curves:
        fig, (ax_lat, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.5))
        factor = bus_factor(curve.op, curve.group_size)
        series = dict(curve.latency_us)
        series["chosen"] = chosen_latency(table, curve)
        for name, lat in series.items():
            pts = [(s, t) for s, t in zip(curve.bytes, lat) if t is not None and t > 0]
            if not pts:
                continue
            xs, ts = zip(*pts)
            bw = [s / (t * 1e-6) / 1e9 * factor for s, t in pts]
            style = (
                dict(color="black", linestyle="--", linewidth=2.5, alpha=0.6, zorder=5)
                if name == "chosen"
                else dict(marker=".")
            )
            ax_lat.plot(xs, ts, label=name, **style)
            ax_bw.plot(xs, bw, label=name, **style)
        ax_lat.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="latency (µs, slowest rank)")
        ax_bw.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
        for ax in (ax_lat, ax_bw):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        ax_lat.legend(fontsize=8)
        kind = " (predicted)" if curve.predicted else ""
        fig.suptitle(
            f"{curve.op} {curve.dtype}, {curve.group_size} ranks{kind}: latency and bus bandwidth; dashed = the table's choice"
        )
        fig.tight_layout()
        of_dtype = "" if curve.dtype == "float32" else f"-{curve.dtype}"
        path = os.path.join(directory, f"{curve.op}-n{curve.group_size}{of_dtype}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def markdown(table, plot_paths=(), relative_to=None) -> str:
    """Where each candidate wins, per op: its size ranges and its lead over the runner-up."""
    fp = table.fingerprint
    out = [f"# Tuning report: {fp.get('world_size')} ranks on `{fp.get('hostname')}`{_device(fp)}", ""]
    versions = ", ".join(f"{k} {v}" for k, v in (fp.get("versions") or {}).items())
    if versions:
        out += [f"Versions: {versions}.", ""]
    out += ["Latencies are the slowest rank's median; a candidate takes over only when faster by the margin.", ""]
    for op, size in _groups(table):
        out += [f"## {op}, group of {size}", "", "| sizes | choice | lead over runner-up | |", "|---|---|---|---|"]
        for e in (e for e in table.entries if (e.op, e.group_size) == (op, size)):
            lat = sorted(e.latency_us.items(), key=lambda kv: kv[1])
            mine = e.latency_us.get(label(e.choice))
            others = [t for c, t in lat if c != label(e.choice)]
            lead = f"{min(others) / mine:.2f}x" if mine and others else "only candidate"
            sizes = _range(e) + ("" if e.dtype == "any" else f" {e.dtype}")
            out.append(f"| {sizes} | `{label(e.choice)}` | {lead} | {'predicted' if e.predicted else ''} |")
        out.append("")
    if plot_paths:
        out += ["## Plots", ""]
        for p in plot_paths:
            shown = os.path.relpath(p, relative_to) if relative_to else p
            out.append(f"![{os.path.basename(p)}]({shown})")
        out.append("")
    return "\n".join(out)


def write_beside(table, table_path: str) -> tuple:
    """Plots in `<table>-plots/` and the report `<table>.md`, next to the table file."""
    stem = os.path.splitext(table_path)[0]
    try:  # matplotlib is optional (pip install 'mcr-dl[plots]'): the table and report need none
        plots = write_plots(table, stem + "-plots")
    except ImportError as exc:
        plots = []
        print(f"mcr: no plots beside {table_path} ({exc}; pip install matplotlib)", file=sys.stderr)
    report_path = stem + ".md"
    with open(report_path, "w") as f:
        f.write(markdown(table, plots, os.path.dirname(os.path.abspath(report_path))))
    return plots, report_path
