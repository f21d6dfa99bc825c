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
