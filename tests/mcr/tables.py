"""Tuning tables the multi-rank tests run under."""

CHUNK_FROM = 64 << 10  # all-reduces from this size run chunked
CHUNK_BYTES = (
    32 << 10
)  # not a multiple of the element patterns' periods (scripts/stress.py), so a misplaced chunk shows


def size_split_table(path, world_size):
    """A table whose choice flips with message size for every op the stress script issues, on
    the world and on a 2-rank subgroup (chunked all-reduce above 64 KiB)."""
    from mcr.tuning.table import Entry, TuningTable

    entries = []
    for group_size in sorted({world_size, 2}):
        for op, small, large in [
            ("all_reduce", "gloo", "mpi"),
            ("all_gather", "mpi", "gloo"),
            ("reduce_scatter", "gloo", "mpi"),
            ("all_to_all", "gloo", "mpi"),
            ("broadcast", "mpi", "gloo"),
            ("send_recv", "gloo", "mpi"),
        ]:
            top = CHUNK_FROM if op == "all_reduce" else None
            entries.append(Entry(op=op, group_size=group_size, min_bytes=0, max_bytes=1024, backend=small))
            entries.append(Entry(op=op, group_size=group_size, min_bytes=1024, max_bytes=top, backend=large))
        entries.append(
            Entry(
                op="all_reduce", group_size=group_size, min_bytes=CHUNK_FROM, max_bytes=None, backend="mpi",
                chunk_bytes=CHUNK_BYTES,
            )
        )  # fmt: skip
    TuningTable(fingerprint={"world_size": world_size}, entries=entries).save(str(path))
    return str(path)


def chunking_table(path, world_size):
    """Every op on MPI, all-reduces from 64 KiB as trains of 32 KiB chunks: a blocking op on MPI
    is then a point where every earlier op has completed (its communicator completes them first)."""
    from mcr.tuning.table import Entry, TuningTable

    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
    entries = [
        Entry(op=op, group_size=world_size, min_bytes=0, max_bytes=CHUNK_FROM if op == "all_reduce" else None,
              backend="mpi")
        for op in ops
    ]  # fmt: skip
    entries.append(
        Entry(op="all_reduce", group_size=world_size, min_bytes=CHUNK_FROM, max_bytes=None, backend="mpi",
              chunk_bytes=CHUNK_BYTES)
    )  # fmt: skip
    TuningTable(fingerprint={"world_size": world_size}, entries=entries).save(str(path))
    return str(path)
