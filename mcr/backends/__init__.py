"""The communication libraries the runtime runs ops on, listed once.

Adding a library is its module here (a `Backend`, see base.py) and one `register(...)` line
below. Everything else that names backends reads this list: the config check (`mcr.config`),
the runtime's start-up, the built-in order the choice falls back on (`mcr.choose`), the tools
(`mcr.tools.tune`, `explain`), the trainers' `comm.backend`, and `launch sweep --backends`.
"""

from __future__ import annotations

from typing import NamedTuple

from .base import Backend
from .mpi import MPIBackend
from .torch_dist import GlooBackend, NcclBackend


class Registered(NamedTuple):
    cls: type  # a Backend subclass; its `name` is what users write (backend=, MCR_BACKENDS, tables)
    order: dict  # device type -> its place in the built-in order there (1 first); absent: never picked there


REGISTRY: dict[str, Registered] = {}


def register(cls: type, order=None) -> type:
    """Make `cls` a backend the runtime starts (where available, in the order registered) and
    every setting accepts by `cls.name`. `order`: {device type: place}, where the built-in choice
    (no override, table or default backend decides) tries it on that device, 1 first."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)) or cls.name in REGISTRY:
        raise ValueError(f"register: {cls!r} is not a Backend subclass, or {getattr(cls, 'name', '?')!r} is taken")
    REGISTRY[cls.name] = Registered(cls, dict(order or {}))
    return cls


def names() -> tuple:
    return tuple(REGISTRY)


def builtin_order(device_type: str) -> tuple:
    """The backends the built-in choice tries on `device_type`, first preferred."""
    found = [(entry.order[device_type], name) for name, entry in REGISTRY.items() if device_type in entry.order]
    return tuple(name for _, name in sorted(found, key=lambda place_name: place_name[0]))


# Measured on CPU, MPI beats gloo at every size; on GPU nccl is the reference.
register(MPIBackend, order={"cpu": 1, "cuda": 2})
register(GlooBackend, order={"cpu": 2, "cuda": 3})
register(NcclBackend, order={"cuda": 1})
