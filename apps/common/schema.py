"""Field helpers for the apps' config schemas. This module imports nothing heavy, so model and
data modules that declare config fields load without the runtime: the stock-DeepSpeed reference
in tests/apps builds the MoE model with mcr never imported."""

from __future__ import annotations

import dataclasses


def choice(*values, default=None):
    """A dataclass field that accepts only `values` (the first is the default unless given)."""
    return dataclasses.field(default=values[0] if default is None else default, metadata={"choices": values})
