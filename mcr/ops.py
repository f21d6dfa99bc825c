"""Names the runtime uses for operations, reduce ops and message sizes.

An op *family* is the unit of backend choice: variants that must meet on the same backend
(send with recv, all_gather with all_gather_into_tensor) share one family name, so an override
or a tuning-table entry for the family covers all of them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp

OP_FAMILIES = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
    "barrier",
)

REDUCE_OPS = {
    "sum": ReduceOp.SUM,
    "avg": ReduceOp.AVG,
    "product": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
}


def bus_factor(family: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor, comparable to link speed."""
    if n <= 1:
        return 1.0
    if family == "all_reduce":
        return 2.0 * (n - 1) / n
    if family in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class Average:
    """AVG's finisher where the library has no average of its own: the SUM's result divided by
    the group size. A library with one (`Backend.native_avg`) gets "avg" instead (`Runtime.call`)."""

    __slots__ = ("tensor", "group_size")

    def __init__(self, tensor, group_size):
        self.tensor, self.group_size = tensor, group_size

    def __call__(self):
        self.tensor.div_(self.group_size)


def as_average(args) -> tuple:
    """A reduction's arguments with its "sum" made "avg" (the only string among them)."""
    return tuple("avg" if type(a) is str else a for a in args)
