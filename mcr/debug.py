"""`MCR_DEBUG=detail`: before each collective, the ranks of the group check that they are
making the same call, as `TORCH_DISTRIBUTED_DEBUG=DETAIL` does for torch.distributed.

Each rank describes its call (sequence number on the group, op, dtype, reduce op, message
size) in a few integers and all-gathers them over the group on gloo. gloo always, whatever
backend the call itself will use: ranks making different calls may choose different backends,
and the check must meet on one. The first mismatch stops the job with a message naming every
rank's call. A skipped call shows up as a mismatch at the next call, or at `finalize()`, which
is checked as a call of its own.

Cost: one small gloo all-gather per collective (how to measure it: docs/observability.md).
"""

from __future__ import annotations

import torch

from .ops import OP_FAMILIES, REDUCE_OPS

# Families whose message size may legitimately differ by rank (uneven all-to-all): only the
# dtype, op and sequence must agree.
SIZE_MAY_DIFFER = {"all_to_all"}
_CALLS = OP_FAMILIES + ("finalize",)
_REDUCE = (None,) + tuple(REDUCE_OPS)
_FIELDS = 5  # sequence, call, dtype, reduce op, message bytes
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    None,  # barrier
)


class CollectiveMismatchError(RuntimeError):
    pass


class CallChecker:
    def __init__(self, gather, rank: int):
        self._gather = gather  # gather(group, out, mine): a blocking all-gather on gloo
        self._rank = rank
        self._seq = {}  # group id -> collectives checked on it so far

    def check(self, family: str, group, nbytes: int, dtype, reduce_op=None) -> None:
        """Raise CollectiveMismatchError unless every rank of `group` makes the same call now."""
        seq = self._seq.get(group.gid, 0) + 1
        self._seq[group.gid] = seq
        mine = torch.tensor(
            [seq, _CALLS.index(family), _dtype_code(dtype), _REDUCE.index(reduce_op), nbytes], dtype=torch.int64
        )
        everyone = torch.empty(_FIELDS * group.size, dtype=torch.int64)
        self._gather(group, everyone, mine)
        rows = everyone.view(group.size, _FIELDS).tolist()
        if all(_same(rows[0], row, family) for row in rows):
            return
        calls = "; ".join(f"rank {r} {_describe(row)}" for r, row in zip(group.ranks, rows))
        raise CollectiveMismatchError(
            f"mcr debug: rank {self._rank}: the ranks of group {list(group.ranks)} made different collective "
            f"calls: {calls}. Every rank of a group must issue the same collectives in the same order "
            "(same op, dtype, reduce op and message size)."
        )


def _same(a, b, family) -> bool:
    if family in SIZE_MAY_DIFFER and _CALLS[b[1]] == family:
        return a[:4] == b[:4]
    return a == b


def _dtype_code(dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _describe(row) -> str:
    seq, call, dtype, reduce_op, nbytes = row
    family = _CALLS[call]
    if family == "finalize":
        return f"called finalize() after {seq - 1} collectives"
    dtype_name = str(_DTYPES[dtype]).replace("torch.", "") if dtype < len(_DTYPES) else "other dtype"
    op = f", {_REDUCE[reduce_op]}" if _REDUCE[reduce_op] else ""
    return f"called {family} #{seq} ({dtype_name}{op}, {nbytes} bytes)"
