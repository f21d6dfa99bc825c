"""What of `mcr.streams` (the stream rules for CUDA tensors) runs without a GPU; tests/gpu runs
the rules themselves on one."""

import inspect

from mcr.backends.base import Backend
from mcr.streams import STAGED_ARGS
from mcr.topology import Topology

OP_METHODS = [
    name
    for name, fn in vars(Backend).items()
    if inspect.isfunction(fn) and list(inspect.signature(fn).parameters)[1:2] == ["g"]
]


def test_staging_knows_what_every_backend_op_reads_and_writes():
    # an op missing here would raise KeyError on a GPU only, where MPI is not CUDA-aware
    assert len(OP_METHODS) == 14, OP_METHODS
    assert sorted(STAGED_ARGS) == sorted(OP_METHODS)
    for method, (reads, writes) in STAGED_ARGS.items():
        params = list(inspect.signature(getattr(Backend, method)).parameters)[2:-1]  # after self, g; before async_op
        for position in (*reads, *writes):
            assert position < len(params), (method, position, params)
        # what an op reads or writes are its tensors, never a rank, tag or reduce op
        assert not {params[p] for p in (*reads, *writes)} & {"dst", "src", "tag", "op"}, method


def test_ranks_that_share_a_gpu_are_named_and_ranks_without_one_share_none():
    topology = Topology(["a", "a", "b", "b"], ["GPU-a0", "GPU-a1", "GPU-b0", "GPU-b0"])
    assert topology.shared_gpu([0, 1, 2]) is None
    assert topology.shared_gpu([1, 2, 3]) == (2, 3)
    assert Topology(["a", "a"]).shared_gpu([0, 1]) is None  # no GPUs: nothing is shared
