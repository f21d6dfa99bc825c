"""The framework versions the hooks were tested with, and a clear warning outside them.

The torch backend subclasses torch's C++ `ProcessGroup` and registers through its extended
backend API; the DeepSpeed hook subclasses DeepSpeed's `TorchBackend`. Both APIs change
between releases, so a version outside the tested range gets a warning that names the range
and what to do, instead of a confusing failure deep inside a collective.
"""

from __future__ import annotations

import re
import warnings

# package: the ranges tested, oldest first, each (lowest tested, first untested): a tested release
# and its later patch releases, or consecutive tested releases. A release between two ranges was
# not tested (`make test`'s hooks and conformance tests, the README says how each was run).
TESTED = {
    "torch": [("2.11", "2.16")],
    "deepspeed": [("0.19.8", "0.20")],
}


class UntestedVersionWarning(UserWarning):
    """A framework version outside the range the hooks were tested with."""


def release(version: str) -> tuple[int, ...]:
    """(2, 13, 0) from "2.13.0+cpu" or "2.13.0.dev20260101": the numeric release only."""
    match = re.match(r"\d+(\.\d+)*", str(version))
    if match is None:
        raise ValueError(f"not a version number: {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def pip_range(package: str, index: int = -1) -> str:
    """A tested range as pip reads it (default: the newest), e.g. "torch>=2.13,<2.15"."""
    low, high = TESTED[package][index]
    return f"{package}>={low},<{high}"


def untested_message(package: str, version: str) -> str | None:
    """The warning text when `version` of `package` is outside its tested ranges, else None."""
    if any(release(low) <= release(version) < release(high) for low, high in TESTED[package]):
        return None
    ranges = " or ".join(pip_range(package, i) for i in range(len(TESTED[package])))
    return (
        f"mcr.hooks: {package} {version} is outside the versions the hooks were tested with "
        f"({ranges}). Install a tested version (pip install '{pip_range(package)}'), "
        f"or run tests/hooks with {package} {version} and, if they pass, widen TESTED in mcr/hooks/versions.py."
    )


def warn_if_untested(package: str, version: str) -> None:
    message = untested_message(package, version)
    if message is not None:
        warnings.warn(message, UntestedVersionWarning, stacklevel=3)
