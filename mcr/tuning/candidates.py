"""Candidates: the ways an op can be carried out, named like `mpi`, `gloo`, `mpi/chunk=1M`,
`mpi/host` or `node:mpi+gloo`.

A candidate is a backend plus how it runs the op: whole; as a train of chunks (all-reduce,
`mpi/chunk=1M`); on CUDA tensors staged through host memory (`BACKEND/host`: the backend runs
on pinned host copies, even where it could read device memory itself, as a CUDA-aware MPI can;
on host tensors it is the plain backend); or node-aware (`node:INTRA+INTER`: the phases inside
each node on INTRA, the phase between nodes on INTER; `mcr.node_aware`), for the ops in
NODE_AWARE_OPS on groups with the same number of ranks on each of several nodes. The grammar:
`BACKEND[/host][/chunk=SIZE]` or `node:INTRA+INTER` (plain backends inside). Labels are what
the tuning table, the plots, the report and the comm log show; `Choice` is what the runtime
acts on.
"""

from __future__ import annotations

from .table import Choice

CHUNKABLE_OPS = ("all_reduce",)  # ops the runtime can run in chunks (`mcr.chunked`)
NODE_AWARE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")  # mcr.node_aware
NODE_PREFIX = "node:"
HOST_SUFFIX = "/host"
_UNITS = (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def short_bytes(n: int) -> str:
    """1048576 -> '1M', 262144 -> '256K', 1000 -> '1000'."""
    for unit, size in _UNITS:
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def parse_bytes(text) -> int:
    """'1M', '256K', '64MiB', '4' -> bytes."""
    if isinstance(text, int):
        return text
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    for unit, size in _UNITS:
        if t.endswith(unit):
            return int(float(t[:-1]) * size)
    return int(t)


def label(choice: Choice) -> str:
    if choice.inter:
        return f"{NODE_PREFIX}{choice.backend}+{choice.inter}"
    text = choice.backend + (HOST_SUFFIX if choice.host else "")
    return text if not choice.chunk_bytes else f"{text}/chunk={short_bytes(choice.chunk_bytes)}"


def parse_label(text: str) -> Choice:
    if text.startswith(NODE_PREFIX):
        intra, plus, inter = text[len(NODE_PREFIX) :].partition("+")
        if not (intra and plus and inter) or "/" in intra + inter:
            raise ValueError(f"bad candidate {text!r}; a node-aware one is node:INTRA+INTER, e.g. node:mpi+gloo")
        return Choice(intra, 0, inter)
    backend, *ways = text.split("/")
    host, chunk = ways[:1] == ["host"], 0
    rest = ways[1:] if host else ways
    if rest:
        key, _, value = rest[0].partition("=")
        if len(rest) > 1 or key != "chunk" or not value:
            raise ValueError(
                f"bad candidate {text!r}; write a backend name, backend/chunk=SIZE or backend/host[/chunk=SIZE] "
                f"(e.g. mpi/chunk=1M, mpi/host)"
            )
        chunk = parse_bytes(value)
    return Choice(backend, chunk, host=host)


def run_as(choice: Choice) -> tuple:
    """(backend= for the call, chunk bytes) that measure a candidate (`mcr.measure.make_call`):
    backend= names a backend, BACKEND/host or node:INTRA+INTER; the caller makes the chunks."""
    return label(Choice(choice.backend, 0, choice.inter, choice.host)), choice.chunk_bytes


def is_node_aware(text: str) -> bool:
    return text.startswith(NODE_PREFIX)


def applies(choice: Choice, nbytes: int) -> bool:
    """A chunked candidate is only worth measuring where it makes at least two chunks."""
    return choice.chunk_bytes == 0 or nbytes >= 2 * choice.chunk_bytes


def whole(backends, device: str = "cpu") -> list:
    """Each backend running an op whole; on CUDA tensors each also staged through host memory
    (BACKEND/host), which a backend that reads device memory itself (CUDA-aware MPI) may lose or
    win against. A caller drops what its started backends cannot run (NCCL on host copies)."""
    out = [Choice(b) for b in backends]
    if device != "cpu":
        out += [Choice(b, host=True) for b in backends]
    return out


def for_op(op: str, backends, chunks=(), node_aware=False, device: str = "cpu") -> list:
    """Candidates for one op, in order of preference on ties: plain backends in the given
    order (the runtime's built-in order first), on CUDA each also staged through host memory,
    then chunked variants of those, then (`node_aware`: the group spans several nodes with
    several ranks on each) every intra+inter pair of backends."""
    out = whole(backends, device)
    if op in CHUNKABLE_OPS:
        out += [Choice(c.backend, k, host=c.host) for c in whole(backends, device) for k in chunks]
    if node_aware and op in NODE_AWARE_OPS:
        out += [Choice(intra, 0, inter) for intra in backends for inter in backends]
    return out
