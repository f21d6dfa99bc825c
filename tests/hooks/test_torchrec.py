"""TorchRec DistributedModelParallel with a sharded DLRM on backend "mcr" vs plain gloo."""

import importlib.util
import textwrap

import pytest

from tests.hooks.common import assert_same_losses, families, run, tagged

# the [torchrec] extra, absent where no fbgemm-gpu build fits the torch (2.15 has none yet); an
# installed TorchRec that fails to load still fails the test
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchrec") is None, reason="TorchRec is not installed (pip install '.[torchrec]')"
)

# all-to-alls under 64 B on gloo, larger ones on MPI: the KJT exchange's uneven sizes straddle
# the threshold, so ranks only stay matched if the runtime agrees on one size per call.
SPLIT_TABLE = textwrap.dedent("""\
    format: mcr-tuning-table
    version: 1
    fingerprint: {world_size: 2}
    entries:
      - {op: all_to_all, group_size: 2, dtype: any, min_bytes: 0, max_bytes: 64, backend: gloo}
      - {op: all_to_all, group_size: 2, dtype: any, min_bytes: 64, max_bytes: null, backend: mpi}
""")


def test_sharded_dlrm_on_mcr_matches_gloo_with_size_split_all_to_all(tmp_path):
    table = tmp_path / "split.yaml"
    table.write_text(SPLIT_TABLE)
    out = run("scripts/torchrec_dlrm.py", "mcr", env={"LOCAL_WORLD_SIZE": "2", "MCR_TUNING_FILE": str(table)})
    baseline = run("scripts/torchrec_dlrm.py", "gloo", launcher="torchrun")
    assert tagged(out, "PLAN")["0"] == ["column_wise", "row_wise", "table_row_wise", "table_wise"]
    assert_same_losses(tagged(out, "LOSSES"), tagged(baseline, "LOSSES"))
    for rank in ("0", "1"):
        ops = families(tagged(out, "COMMLOG")[rank])
        assert ops.get("all_to_all") == {"gloo", "mpi"}, f"rank {rank}: the table's split was not exercised: {ops}"
        assert "reduce_scatter" in ops, ops  # row-wise tables' pooled embeddings
        assert "all_reduce" in ops, ops  # DDP over the dense part
