"""BaPipe: a balanced pipeline planner (profile -> cluster -> plan -> simulate -> output).

Modules, one job each: ``models`` (layer stacks), ``profile`` (per-layer measurement),
``cluster`` (devices and links), ``explore`` (cost model and partition search),
``simulate`` (event-level schedule simulation and timeline), ``pipeline_run`` (a real DeepSpeed
pipeline), ``report`` (study tables), ``__main__`` (the command line).
"""
