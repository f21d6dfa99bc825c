"""The backend choice as a pure function: a call's description in, a backend, chunk size and
the rule that decided out. `mcr.routing.Router` runs it for every new kind of call, and
`python -m mcr.tools.explain` runs it for calls it only imagines, so both say the same thing.

The order (docs/runtime.md, "How the backend is chosen"): `backend=` on the call, force_backend(), a
per-op override, the tuning table, the configured default, the built-in order. Then the choice
is made runnable: a node-aware candidate where the op has no node-aware form, or the group an
uneven shape, runs flat; a backend that is missing or cannot run the call falls back to the
first of the built-in order that can. Nothing here logs: the runtime says each `Note` once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import NamedTuple

from . import backends as registry
from . import node_aware
from .backends import builtin_order
from .ops import dtype_name
from .tuning.candidates import HOST_SUFFIX, NODE_PREFIX, is_node_aware, label, parse_label, short_bytes
from .tuning.table import Choice, TuningTable, TuningTables


class Call(NamedTuple):
    """What the choice may depend on: values equal on every rank of the group (rule 1)."""

    family: str
    nbytes: int
    group_size: int
    nodes: int | None  # the nodes the group spans (None: unknown)
    dtype: object  # a torch dtype
    device_type: str
    reduce_op: str | None = None
    explicit: str | None = None  # backend= on the call
    shape: object = None  # the group's mcr.topology.Shape (None: unknown, taken as even)
    group: Hashable = 0  # the group's key: an uneven group's flat run is said once per group
    # backends with no communicator on the group; on its node-local groups; on its peer groups
    # (NCCL where two members share a GPU: the GPUs are known alike on every rank)
    missing: frozenset = frozenset()
    missing_intra: frozenset = frozenset()
    missing_inter: frozenset = frozenset()
    tagged: bool = False  # a send or receive with a tag (a library that ignores tags cannot run it)
    timed: bool = False  # a barrier with a timeout of its own (only a library that takes one can run it)

    @property
    def uniform(self) -> bool:
        """The group holds the same number of its ranks on each node (node-aware ops need it)."""
        return self.shape is None or self.shape.per_node is not None


class Policy(NamedTuple):
    """The job's settings the choice reads (mcr.config, force_backend())."""

    overrides: Mapping[str, str]  # op family -> backend, BACKEND/host or node:INTRA+INTER ("auto": none)
    default: str = "auto"
    forced: str | None = None


class Note(NamedTuple):
    """A choice not run as chosen, for the runtime to say once (`key`) on the world's rank 0
    (`by_group` False) or on the group's first rank (True)."""

    key: tuple
    text: str
    by_group: bool


class Selection(NamedTuple):
    backend: str  # what runs the op; node-aware: the inter-node backend
    chunk_bytes: int  # > 0: an all-reduce larger than this runs as a train of chunks
    intra: str  # node-aware: the intra-node backend; "" for a flat op
    rule: str  # the rung that decided, e.g. "the tuning table t.yaml (entry 2: all_reduce [0, 1M))"
    chosen: str  # the candidate that rung named (differs from `label` after a fallback)
    notes: tuple  # (Note, ...): why the op does not run as `chosen`
    host: bool = False  # stage the call's CUDA tensors through host memory (BACKEND/host); never on CPU

    @property
    def label(self) -> str:
        inter = self.backend if self.intra else ""
        return label(Choice(self.intra or self.backend, self.chunk_bytes, inter, self.host))


def entry_text(table: TuningTable, entry) -> str:
    """`entry 2: all_reduce [0, 1M)`: where to look in the file (entries counted from 0)."""
    index = table.position(entry)  # a dict look-up: made on every new kind of call
    high = "inf" if entry.max_bytes is None else short_bytes(entry.max_bytes)
    where = f" on {entry.nodes} node(s)" if entry.nodes is not None else ""
    dtype = f" {entry.dtype}" if entry.dtype != "any" else ""
    return f"entry {index}: {entry.op}{dtype} [{short_bytes(entry.min_bytes)}, {high}){where}"


def table_rule(table: TuningTable | TuningTables | None, call: Call):
    """(Choice, rule) from a fixed tuning table (or the one of a job's tables for the call's
    device), or None where it has no entry for the call."""
    table = None if table is None else table.for_device(call.device_type)
    if table is None:
        return None  # a table speaks for the device its tensors were measured on
    entry = table.find(call.family, call.nbytes, call.group_size, dtype_name(call.dtype), call.nodes)
    if entry is None:
        return None
    return entry.choice, f"the tuning table {table.path} ({entry_text(table, entry)})"


def select_backend(
    call: Call,
    policy: Policy,
    backends: Mapping[str, object],
    unavailable: Mapping[str, str],
    from_table: Callable[[], tuple | None],
) -> Selection:
    """The backend for `call`. `backends`: name -> an object with `supports(family, dtype,
    reduce_op, device_type)` and `refusal(...)` (`mcr.backends.base.Backend`'s); `unavailable`: name -> why it is not there; `from_table()`:
    (Choice, rule) or None, asked only when no earlier rung decides (an online table measures)."""
    family = call.family
    chunk, inter, host = 0, "", False
    if call.explicit is not None:
        name, why = call.explicit, "asked for by backend="
        require(name, family, why, backends, unavailable, call.missing)
    elif policy.forced is not None:
        name, why = policy.forced, "forced by force_backend()"  # checked when it was forced
    elif policy.overrides.get(family, "auto") != "auto":
        name, why = policy.overrides[family], f"the override for {family}"
        require(name, family, why, backends, unavailable, call.missing)
    else:
        found = from_table()
        if found is not None:
            choice, why = found
            name, chunk, inter, host = choice.backend, choice.chunk_bytes, choice.inter, choice.host
        elif policy.default != "auto":
            name, why = policy.default, "the default backend"
            require(name, family, why, backends, unavailable, call.missing)
        else:
            order = builtin_order(call.device_type)
            name = next((n for n in order if _runs(backends, n, call)), order[-1])
            why = "the built-in order"
    if is_node_aware(name):
        choice = parse_label(name)
        name, inter = choice.backend, choice.inter
    elif name.endswith(HOST_SUFFIX):  # BACKEND/host, as backend= or a setting names it
        name, host = name.removesuffix(HOST_SUFFIX), True
    chunk = chunk if family == "all_reduce" else 0  # only all-reduces run chunked
    chosen = label(Choice(name, chunk, inter, host))
    if inter:
        return _node_plan(call, backends, unavailable, name, inter, why)
    host = host and call.device_type != "cpu"  # host tensors need no staging: BACKEND/host runs as BACKEND
    if _runs(backends, name, call, host):
        return Selection(name, chunk, "", why, chosen, (), host)
    fallback, note = _fallback(call, backends, unavailable, name, why, host)
    return Selection(fallback, 0, "", why, chosen, (note,))


def require(name: str, family: str, why: str, backends, unavailable, missing=frozenset()) -> None:
    """A backend (or both of a node-aware candidate's; a staged one's, BACKEND/host) that a user
    named must be there; a flat one also on the call's group (`missing`: those with no
    communicator there; a node-aware one's phases run on other groups, checked by `_node_plan`)."""
    if is_node_aware(name):
        names, missing = (lambda c: [c.backend, c.inter])(parse_label(name)), frozenset()
    else:
        names = [name.removesuffix(HOST_SUFFIX)]
    for part in names:
        if part not in backends or part in missing:
            reason = unavailable.get(
                part,
                f"unknown backend; choose one of {', '.join(registry.names())}, BACKEND/host or node:INTRA+INTER",
            )
            raise ValueError(f"mcr.{family}: backend {part!r} ({why}) is unavailable: {reason}")


def _runs(backends, name, call, host=False, missing=None) -> bool:
    """`host`: the backend runs on host copies of the call's tensors. `missing`: the backends
    with no communicator where it would run (default: the call's group)."""
    backend = backends.get(name)
    device_type = "cpu" if host else call.device_type
    return (
        backend is not None
        and name not in (call.missing if missing is None else missing)
        and backend.supports(call.family, call.dtype, call.reduce_op, device_type)
        and (not call.tagged or backend.p2p_tags)
        and (not call.timed or backend.call_timeouts)
    )


def _node_plan(call, backends, unavailable, intra, inter, why) -> Selection:
    """A node-aware candidate, or the flat op where it has no node-aware form: on the inter-node
    backend where the group spans nodes, else on the intra-node one."""
    family, label_ = call.family, f"{NODE_PREFIX}{intra}+{inter}"
    phases = node_aware.PHASES.get(family)
    if phases is None:
        problem, key = f"has no node-aware {family}", (label_, family)
    elif not call.uniform:
        problem = f"needs the same number of ranks on each node, and the group has {call.shape}"
        key = (label_, call.group)
    else:
        if all(
            _runs(backends, name, call._replace(family=phase), missing=missing)
            for name, phase, missing in ((intra, phases[0], call.missing_intra), (inter, phases[1], call.missing_inter))
        ):
            return Selection(inter, 0, intra, why, label_, ())
        problem = f"cannot run {family} on {call.device_type} {dtype_name(call.dtype)} tensors on both backends"
        if intra in call.missing_intra or inter in call.missing_inter:
            problem = "has no communicator on the node-local or peer groups (two of their ranks share a GPU)"
        key = (label_, family, call.dtype, call.reduce_op)
    flat = inter if (call.nodes or 1) > 1 else intra
    notes = (Note(key, f"{label_} ({why}) {problem}; running {family} flat on {flat}", True),)
    if _runs(backends, flat, call):
        return Selection(flat, 0, "", why, label_, notes)
    fallback, note = _fallback(call, backends, unavailable, flat, why)
    return Selection(fallback, 0, "", why, label_, notes + (note,))


def _fallback(call, backends, unavailable, name, why, host=False) -> tuple:
    """The first backend of the built-in order that can run the call, and the note saying so
    (`host`: `name` was to run on host copies of its tensors)."""
    family, dtype, reduce_op, device_type = call.family, call.dtype, call.reduce_op, call.device_type
    for candidate in builtin_order(device_type):
        if _runs(backends, candidate, call):
            if name in call.missing:  # said once per group, by its first rank
                note = f"{name} ({why}) has no communicator on this group ({unavailable.get(name)}); using {candidate} for {family}"
                return candidate, Note((name, call.group), note, True)
            if name not in backends:
                problem = f"is unavailable ({unavailable.get(name, 'unknown backend')})"
            elif call.timed and not backends[name].call_timeouts:
                problem = "takes no timeout per call"
            else:
                op_name = f" {reduce_op}" if reduce_op is not None else ""
                copies = "host copies of " if host else ""
                problem = f"cannot run {family}{op_name} on {copies}{device_type} {dtype_name(dtype)} tensors"
                why_not = backends[name].refusal(family, dtype, reduce_op, device_type)
                if why_not is not None:
                    problem += f": it {why_not}"
            key = (name, family, dtype, reduce_op, device_type)
            return candidate, Note(key, f"{name} ({why}) {problem}; using {candidate} for {family}", False)
    if call.timed:
        raise ValueError(
            f"mcr.{family}: a timeout per call needs a backend that takes one (gloo), and none of "
            f"{', '.join(backends)} does; add gloo to the backends (MCR_BACKENDS) or drop the timeout"
        )
    op_name = f"{reduce_op} " if reduce_op is not None else ""
    raise ValueError(
        f"mcr.{family}: no available backend ({', '.join(backends)}) can run {op_name}on "
        f"{device_type} {dtype_name(dtype)} tensors"
    )
