"""Run a real DeepSpeed pipeline (``PipelineModule``, 1F1B) on CPU processes and time it.

``run_partitions`` starts one process per stage on loopback (gloo, ``DS_ACCELERATOR=cpu``,
one thread each), and in those processes trains the GPT-like stack once per requested
partition, so the planner's partition and DeepSpeed's own methods meet the same conditions.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from .models import build


def planned_pipeline_module(layers, parts, **kwargs):
    """A ``PipelineModule`` split at explicit boundaries: ``parts`` is DeepSpeed's own
    ``parts`` list (first layer of every stage, then the number of layers), or one of its
    ``partition_method`` names ('uniform', 'parameters', 'type:...')."""
    from deepspeed.pipe import PipelineModule

    class PlannedPipelineModule(PipelineModule):
        # DeepSpeed takes only method names; this hook lets it take the planner's boundaries
        def _partition_layers(self, method="uniform"):
            if not isinstance(method, (list, tuple)):
                return super()._partition_layers(method)
            if len(method) != self.num_stages + 1 or method[0] != 0 or method[-1] != len(self._layer_specs) \
                    or any(a >= b for a, b in zip(method, method[1:])):
                raise ValueError(f"parts {method} must rise from 0 to {len(self._layer_specs)} "
                                 f"with {self.num_stages} non-empty stages")
            self.parts = list(method)
            stage_id = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])

    return PlannedPipelineModule(layers=layers, partition_method=parts, **kwargs)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(args):
    import torch
    import deepspeed
    import deepspeed.comm as dist

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for spec in args.partitions.split(";"):
        parts = [int(v) for v in spec.split(",")] if spec[0].isdigit() else spec
        stack = build("gpt-like", **json.loads(args.model_kwargs))   # same seed: same weights everywhere
        module = planned_pipeline_module(stack.layers, parts, num_stages=dist.get_world_size(),
                                         loss_fn=stack.loss_fn)
        config = {"train_micro_batch_size_per_gpu": args.micro_batch,
                  "gradient_accumulation_steps": args.microbatches,
                  "steps_per_print": 10 ** 9, "pipeline": {"activation_checkpoint_interval": 0}}
        optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-4)
        engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
        batch = stack.make_batch(args.micro_batch)
        data = iter(lambda: batch, None)   # endless; the same batch keeps timings comparable
        times = []
        for step in range(args.warmup + args.iters):
            dist.barrier()
            start = time.perf_counter()
            loss = engine.train_batch(data)
            times.append(time.perf_counter() - start)
        results.append({"partition": spec, "parts": [int(v) for v in module.parts], "loss": float(loss),
                        "iteration_s": statistics.median(times[args.warmup:]),
                        "iterations_s": times[args.warmup:]})
        del engine, module, optimizer
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def run_partitions(partitions, microbatches, micro_batch, iters=4, warmup=2, stages=2,
                   model_kwargs=None, timeout_s=900):
    """Train the GPT-like stack on ``stages`` local processes once per partition.

    ``partitions``: each a list of DeepSpeed ``parts`` or a ``partition_method`` name.
    Returns one dict per partition with the measured median ``iteration_s``."""
    specs = [",".join(map(str, p)) if isinstance(p, (list, tuple)) else p for p in partitions]
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        procs = []
        for rank in range(stages):
            env = dict(os.environ, DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(stages), LOCAL_WORLD_SIZE=str(stages), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            cmd = [sys.executable, "-m", "bapipe.pipeline_run", "--partitions", ";".join(specs),
                   "--microbatches", str(microbatches), "--micro-batch", str(micro_batch),
                   "--iters", str(iters), "--warmup", str(warmup), "--out", out,
                   "--model-kwargs", json.dumps(model_kwargs or {})]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, cwd=os.path.dirname(os.path.dirname(__file__))))
        logs = []
        try:
            for proc in procs:
                logs.append(proc.communicate(timeout=timeout_s)[0])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        if any(p.returncode for p in procs) or not os.path.exists(out):
            tail = "\n".join(log[-3000:] for log in logs)
            raise RuntimeError(f"the DeepSpeed pipeline failed (exit codes {[p.returncode for p in procs]}):\n{tail}")
        with open(out) as f:
            return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description="one stage of the measured DeepSpeed pipeline (internal)")
    parser.add_argument("--partitions", required=True)
    parser.add_argument("--microbatches", type=int, required=True)
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--model-kwargs", default="{}")
    parser.add_argument("--out", required=True)
    _worker(parser.parse_args(argv))


if __name__ == "__main__":
    main()
