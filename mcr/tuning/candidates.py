"""Candidates: the ways an op can be carried out, named like `mpi`, `gloo` or `mpi/chunk=1M`.

A candidate is a backend plus how it runs the op (today: a chunk size for all-reduce, which
`mcr.api` runs as a train of chunks). Labels are what the tuning table, the plots and the report
show; `Choice` is what the runtime acts on.
"""

from __future__ import annotations

from .table import Choice

CHUNKABLE_OPS = ("all_reduce",)  # ops the runtime can run in chunks (mcr.api._chunked_all_reduce)
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
    return choice.backend if not choice.chunk_bytes else f"{choice.backend}/chunk={short_bytes(choice.chunk_bytes)}"


def parse_label(text: str) -> Choice:
    backend, _, how = text.partition("/")
    if not how:
        return Choice(backend)
    key, _, value = how.partition("=")
    if key != "chunk" or not value:
        raise ValueError(f"bad candidate {text!r}; write a backend name or backend/chunk=SIZE (e.g. mpi/chunk=1M)")
    return Choice(backend, parse_bytes(value))


def applies(choice: Choice, nbytes: int) -> bool:
    """A chunked candidate is only worth measuring where it makes at least two chunks."""
    return choice.chunk_bytes == 0 or nbytes >= 2 * choice.chunk_bytes


def for_op(op: str, backends, chunks=()) -> list:
    """Candidates for one op, in order of preference on ties: plain backends in the given
    order (the runtime's built-in order first), then chunked variants."""
    plain = [Choice(b) for b in backends]
    if op not in CHUNKABLE_OPS:
        return plain
    return plain + [Choice(b, c) for b in backends for c in chunks]
