"""BaPipe: a balanced pipeline planner (profile -> cluster -> plan -> simulate -> output).

Modules, one job each: ``models`` (layer stacks), ``profile`` (per-layer measurement),
``cluster`` (devices and links), ``explore`` (cost model and partition search),
``simulate`` (event-level schedule simulation and timeline), ``planned_pipeline`` (a DeepSpeed
``PipelineModule`` cut at a plan's boundaries), ``pipeline_run`` (a real DeepSpeed pipeline,
timed), ``link_measure`` (the link between two local processes), ``local_job`` (runs those two
on local processes through launch.local), ``report`` (study tables), ``__main__`` (the command line).
"""
