"""Commands that measure and inspect the runtime; none of the runtime imports them.

Each is `python -m mcr.tools.NAME` and works from an installed package; those that time ops run
on ranks started by a launcher (`python -m launch.local -n 2 -m mcr.tools.bench` from a checkout,
or mpiexec/srun/torchrun directly).

    bench         latency and bus bandwidth per backend and for the runtime's choice (`mcr-bench`)
    tune          measure the candidates and write a tuning table (`mcr-tune`)
    explain       which backend each op would get, and why, from a table: no ranks needed
    bench_half    the ways to reduce 16-bit tensors
    bench_forms   list-form all_to_all against all_to_all_single
    bench_large   a large float32 all-reduce every way (MPI whole and chunked, rs+ag, gloo) against the memory floor
    bench_polling a mixed MPI + gloo step under one setting of Open MPI's mpi_yield_when_idle
    bench_hooks   the framework hooks' per-call overhead against the raw library call
    bench_ddp     a DDP step with and without the progress thread's overlap
    bench_fsdp2   an FSDP2 step with every op on gloo, on MPI, and on the runtime's choice
    trace         merge the ranks' timeline traces (MCR_TRACE_DIR) into one file; draw one
"""
