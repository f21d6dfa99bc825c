"""A DeepSpeed ``PipelineModule`` cut where the planner says: what a trainer builds from a plan.

    from bapipe.planned_pipeline import planned_pipeline_module
    module = planned_pipeline_module(layers, plan.deepspeed_parts, num_stages=2, loss_fn=loss)

Used by the dense trainer (``apps/dense``) and by the measuring harness (``bapipe.pipeline_run``).
"""


def planned_pipeline_module(layers, parts, on_grid=None, **kwargs):
    """A ``PipelineModule`` split at explicit boundaries: ``parts`` is DeepSpeed's own
    ``parts`` list (first layer of every stage, then the number of layers), or one of its
    ``partition_method`` names ('uniform', 'parameters', 'type:...'). ``on_grid(grid)`` runs
    once DeepSpeed has built the pipeline's process groups (its ``PipelineParallelGrid``) and
    before this stage's layers are built: where layers that need one of those groups (tensor
    parallelism) take it, rather than building the same group again."""
    from deepspeed.pipe import PipelineModule  # importing DeepSpeed takes seconds: only when asked

    class PlannedPipelineModule(PipelineModule):
        # DeepSpeed takes only method names; this hook lets it take the planner's boundaries
        def _partition_layers(self, method="uniform"):
            if on_grid is not None:  # DeepSpeed calls this between building its grid and the layers
                on_grid(self.mpu())
            if not isinstance(method, (list, tuple)):
                return super()._partition_layers(method)
            if (
                len(method) != self.num_stages + 1
                or method[0] != 0
                or method[-1] != len(self._layer_specs)
                or any(a >= b for a, b in zip(method, method[1:]))
            ):
                raise ValueError(
                    f"parts {method} must rise from 0 to {len(self._layer_specs)} "
                    f"with {self.num_stages} non-empty stages"
                )
            self.parts = list(method)
            stage_id = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])

    return PlannedPipelineModule(layers=layers, partition_method=parts, **kwargs)
