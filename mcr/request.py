"""One op call as `mcr.api` hands it to `Runtime.call`, the way torch hands a ProcessGroup an
Options object."""

from __future__ import annotations


class Request:
    """What routes the call (`family`, `nbytes` by the op's own rule, `group`, `tensor` for dtype
    and device, `explicit`: the call's backend=, `reduce_op`: the reduction's name, or for a send
    or receive with a tag "tagged", so that no library without tags is chosen, and for a barrier
    with a timeout "timed", so that one that takes a timeout is) and what runs it
    (`method` of the chosen backend with `args`, `async_op`, and `after`: AVG's divide, run when
    the op is done)."""

    __slots__ = ("family", "method", "nbytes", "group", "tensor", "args", "explicit", "async_op", "reduce_op", "after")

    def __init__(
        self, family, method, nbytes, group, tensor, args, explicit=None, async_op=False, reduce_op=None, after=None
    ):
        # one assignment each: a third faster than one tuple assignment (python -m timeit)
        self.family = family
        self.method = method
        self.nbytes = nbytes
        self.group = group
        self.tensor = tensor
        self.args = args
        self.explicit = explicit
        self.async_op = async_op
        self.reduce_op = reduce_op
        self.after = after
