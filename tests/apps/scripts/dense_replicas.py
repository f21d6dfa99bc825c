"""The one-process reference for data parallelism: the dense trainer on one rank, reading in
each micro-batch the batches every data-parallel replica of the compared run reads.

    python tests/apps/scripts/dense_replicas.py REPLICAS --config configs/dense/tiny.yaml train.micro_batch=8 ...

`train.micro_batch` must be REPLICAS x the compared run's: each micro-batch is replica 0's
batch, then replica 1's, ... (the same `TokenBatches` draws, rank = replica). The mean loss over
all of them is the mean of the replicas' losses, so its gradient is the average of theirs: what
data parallelism all-reduces. Everything else (model, seeds, DeepSpeed's optimizer, clipping and
schedule) is the trainer's own.
"""

import copy
import sys

import torch

from apps.common.data import TokenBatches

replicas = int(sys.argv[1])
one_replica = TokenBatches.get


def every_replica(self, step, split="train"):
    """Replica r's (inputs, targets) for `step`, as the compared run's replica r reads them, stacked."""
    parts = []
    for replica in range(replicas):
        view = copy.copy(self)
        view.batch, view.rank = self.batch // replicas, replica
        parts.append(one_replica(view, step, split))
    return tuple(torch.cat(tensors) for tensors in zip(*parts))


TokenBatches.get = every_replica

if __name__ == "__main__":
    from apps.dense.train import main

    main(sys.argv[2:])
