"""Files a reader may open at any moment (tables, logs, flight records, traces, checkpoints'
`latest`): written whole to a temporary file beside them, synced, then renamed over them."""

from __future__ import annotations

import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp makes its file 0600; the renamed file gets what open() would have given it (a table or
# a flight record another user of the cluster reads, say), read once: os.umask can only be read by
# setting it, which is not safe while other threads create files
MODE = 0o666 & ~_umask()


def write_atomic(path: str, data: str | bytes, suffix: str = "") -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never half.
    `suffix`: of the temporary name (`.tmp-XXXX<suffix>`), for readers that scan the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
    os.fchmod(fd, MODE)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
