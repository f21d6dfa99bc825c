"""fp8 on NCCL below compute capability 9.0: a reduction is refused with the reason and runs
elsewhere, data that is only moved stays on NCCL. Usage: fp8.py (CUDA_MODEL_CAPABILITY=8.0)."""

from tests.streams import cuda_model as cm

cm.install()

import torch  # noqa: E402

import mcr  # noqa: E402
from tests.report import report  # noqa: E402

rt = mcr.init()
fp8 = torch.float8_e4m3fn
picked = {
    family: rt.router.route(family, 64, rt.world, fp8, "cuda", reduce_op=op).op.label
    for family, op in (("all_reduce", "sum"), ("broadcast", None), ("all_gather", None))
}
asked = rt.router.route("all_reduce", 64, rt.world, fp8, "cuda", explicit="nccl", reduce_op="sum")
report("FP8", rt.rank, value={"picked": picked, "asked_nccl": asked.op.label, "rule": asked.rule})
mcr.finalize()
