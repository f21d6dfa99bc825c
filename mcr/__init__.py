"""mcr: a mix-and-match communication runtime. `import mcr as dist` mirrors torch.distributed;
every op also takes `backend=` and otherwise picks its backend per call (see README)."""

from . import hugepages

hugepages.request()  # before anything below imports torch and it allocates: torch reads it once


from .api import (
    abort,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    available_backends,
    barrier,
    batch_isend_irecv,
    broadcast,
    dump_flight_record,
    finalize,
    gather,
    get_local_rank,
    get_local_world_size,
    get_rank,
    get_world_size,
    init,
    irecv,
    is_initialized,
    isend,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    runtime,
    scatter,
    send,
    source_rank,
)
from .config import ConfigError, RuntimeConfig
from .group import Group
from .handle import Handle
from .hooks import torch_backend as _torch_backend  # registers the torch.distributed backend "mcr"
from .ops import ReduceOp
from .runtime import CommError
from .version import __version__
