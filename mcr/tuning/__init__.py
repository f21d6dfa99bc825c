"""Tuning: the table that maps (op, message size, group size, dtype) to a backend.

    table       the file format (TuningTable, Entry, Choice, Curve, Fit), lookup, and a job's
                table per device (TuningTables: `tuning: cpu.yaml,cuda.yaml`)
    candidates  names like `mpi`, `mpi/chunk=1M` or `mpi/host`: a backend and how it runs the op
    rules       measured curves -> entries (margin, crossovers, merging)
    model       latency = alpha + beta * bytes: fit, fill between sizes, predict group sizes
    online      `tuning: auto`: measure each new (op, size bucket) in the job, agree, stick
    fingerprint where a table was measured; report: text summary, PNG plots, Markdown
The command line is `python -m mcr.tools.tune`; the measuring itself is `mcr.measure`, shared with
the online tuner and `mcr.tools.bench`.
"""
