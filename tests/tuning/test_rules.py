"""The table-building rules: margin against flapping, crossovers between measured sizes, merging."""

from mcr.tuning.candidates import label, parse_label
from mcr.tuning.rules import crossover, entries_for, pick, winners
from mcr.tuning.table import Choice, Curve, TuningTable

SIZES = [4, 8, 16, 32, 64, 128]


def curve(**latency):
    return Curve("all_reduce", 2, "float32", SIZES, {k.replace("_", "/chunk="): v for k, v in latency.items()})


def test_a_faster_candidate_within_the_margin_does_not_take_over():
    assert pick({"mpi": 100.0, "gloo": 97.0}, "mpi", 0.05, ["mpi", "gloo"]) == "mpi"
    assert pick({"mpi": 100.0, "gloo": 94.0}, "mpi", 0.05, ["mpi", "gloo"]) == "gloo"


def test_noise_below_the_margin_does_not_flap_the_winner():
    c = curve(mpi=[10, 10, 10, 10, 10, 10], gloo=[10.3, 9.7, 10.2, 9.6, 10.4, 9.8])
    assert winners(c, 0.05, ["mpi", "gloo"]) == ["mpi"] * 6
    entries = entries_for(c, 0.05, ["mpi", "gloo"])
    assert len(entries) == 1 and (entries[0].min_bytes, entries[0].max_bytes, entries[0].backend) == (0, None, "mpi")


def test_without_a_margin_the_same_noise_flaps():
    c = curve(mpi=[10, 10, 10, 10, 10, 10], gloo=[10.3, 9.7, 10.2, 9.6, 10.4, 9.8])
    assert len(entries_for(c, 0.0, ["mpi", "gloo"])) > 3


def test_adjacent_sizes_with_the_same_winner_merge_and_keep_the_latency_at_the_largest():
    c = curve(mpi=[1, 1, 1, 50, 60, 70], gloo=[9, 9, 9, 9, 10, 11])
    entries = entries_for(c, 0.05, ["mpi", "gloo"])
    assert [(e.backend, e.predicted) for e in entries] == [("mpi", False), ("gloo", True), ("gloo", False)]
    assert entries[0].min_bytes == 0 and entries[-1].max_bytes is None
    assert entries[0].latency_at_bytes == 16 and entries[0].latency_us == {"mpi": 1, "gloo": 9}
    assert entries[-1].latency_at_bytes == 128 and entries[-1].latency_us == {"mpi": 70, "gloo": 11}
    # ranges tile the sizes without gaps or overlaps
    assert all(a.max_bytes == b.min_bytes for a, b in zip(entries, entries[1:]))


def test_the_boundary_is_the_crossover_of_the_two_lines_and_is_marked_predicted():
    # between 16 B (mpi 1, gloo 9) and 32 B (mpi 50, gloo 9): 1 + 49 (s-16)/16 = 9  ->  s = 18.6
    assert crossover(16, 32, [1, 50], [9, 9]) == 19
    c = curve(mpi=[1, 1, 1, 50, 60, 70], gloo=[9, 9, 9, 9, 10, 11])
    mpi, gap, gloo = entries_for(c, 0.05, ["mpi", "gloo"])
    assert (mpi.max_bytes, gap.min_bytes, gap.max_bytes, gloo.min_bytes) == (19, 19, 32, 32)
    table = TuningTable({}, [mpi, gap, gloo])
    assert table.lookup("all_reduce", 18, 2, "float32") == Choice("mpi")
    assert table.lookup("all_reduce", 19, 2, "float32") == Choice("gloo")


def test_a_chunked_candidate_is_a_choice_like_a_backend():
    c = curve(mpi=[1, 2, 4, 8, 16, 32], gloo=[9, 9, 9, 9, 20, 40], mpi_1M=[None, None, None, None, 8, 12])
    entries = entries_for(c, 0.05, ["mpi", "gloo", "mpi/chunk=1M"])
    last = entries[-1]
    assert (last.backend, last.chunk_bytes, last.min_bytes) == ("mpi", 1 << 20, 64)
    assert TuningTable({}, entries).lookup("all_reduce", 1000, 2, "float32") == Choice("mpi", 1 << 20)
    assert label(Choice("mpi", 1 << 20)) == "mpi/chunk=1M" and parse_label("gloo/chunk=256K") == Choice(
        "gloo", 256 << 10
    )
