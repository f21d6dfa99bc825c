import json

import pytest
import torch.nn as nn
import torch.nn.functional as F

from bapipe.cluster import Cluster, link_from_tuning_table, parse_number
from bapipe.models import MODELS, build, sequential
from bapipe.profile import Profile, profile_stack


def test_profile_of_a_sequential_counts_bytes_exactly(tmp_path):
    import torch

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    stack = sequential(model, lambda b: (torch.randn(b, 32), torch.randint(0, 10, (b,))), F.cross_entropy)
    profile = profile_stack(stack, micro_batch=8, repeats=2)
    assert [layer.param_bytes for layer in profile.layers] == [(32 * 64 + 64) * 4, 0, (64 * 10 + 10) * 4]
    assert [layer.output_bytes for layer in profile.layers] == [
        8 * 64 * 4,
        8 * 64 * 4,
        0,
    ]  # the last stage sends nothing
    assert profile.layers[0].activation_bytes >= 8 * 32 * 4  # a Linear keeps its input for backward
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in profile.layers)
    profile.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == profile


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_stack_runs_layer_by_layer(name):
    kwargs = {
        "gpt-like": dict(vocab=256, dim=32, blocks=2, seq_len=8),
        "gnmt-like": dict(vocab=256, dim=32, seq_len=6),
        "vgg16": dict(width=0.05, image=32),
        "resnet50": dict(width=0.125, image=32),
    }[name]
    stack = build(name, **kwargs)
    x, labels = stack.make_batch(2)
    for layer in stack.layers:
        x = layer(x)
    assert stack.loss_fn(x, labels).isfinite()


def test_profile_missing_a_field_names_it(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {"layers": [{"name": "a", "forward_s": 1, "backward_s": 1, "param_bytes": 0, "activation_bytes": 0}]}
        )
    )
    with pytest.raises(ValueError, match="output_bytes"):
        Profile.load(path)


def test_cluster_expands_counts_and_reads_units(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "devices:\n  - {memory_bytes: 2GiB, speed: 2, count: 3}\n  - {memory_bytes: 16e9}\n"
        "link: {latency_s: 1e-5, bandwidth_Bps: 10e9}\n"
    )
    cluster = Cluster.load(path)
    assert [d.memory_bytes for d in cluster.devices] == [2 * 2**30] * 3 + [16e9]
    assert [d.speed for d in cluster.devices] == [2, 2, 2, 1]
    assert cluster.allreduce == cluster.link and cluster.bytes_per_param_state == 16


def test_cluster_errors_say_what_to_write():
    with pytest.raises(ValueError, match="link"):
        Cluster.from_dict({"devices": [{"memory_bytes": 1}]})
    with pytest.raises(ValueError, match="unknown keys"):
        Cluster.from_dict(
            {"devices": [{"memory_bytes": 1}], "link": {"latency_s": 0, "bandwidth_Bps": 1}, "bandwith": 3}
        )
    with pytest.raises(ValueError, match="16GiB"):
        parse_number("lots", "memory_bytes")


def test_link_is_fitted_from_an_mcr_tuning_table(tmp_path):
    # an all-reduce over 4 ranks with 2*3 ring steps of 5 us and 2*3/4 of the bytes over 1 GB/s per hop
    rows = []
    for low, high, at in [(1024, 65536, 32768), (65536, 2**20, None), (2**20, 2**24, 2**23)]:
        size = at or (low * high) ** 0.5  # tables without latency_at_bytes: the range's middle
        seconds = 6 * 5e-6 + 1.5 * size / 1e9
        rows.append(
            {
                "op": "all_reduce",
                "group_size": 4,
                "dtype": "any",
                "min_bytes": low,
                "max_bytes": high,
                "backend": "mpi",
                "chunk_bytes": 0,
                "predicted": False,
                "latency_at_bytes": at,
                "latency_us": {"mpi": seconds * 1e6, "gloo": seconds * 3e6},
            }
        )
    path = tmp_path / "table.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"format": "mcr-tuning-table", "version": 1, "fingerprint": {}, "entries": rows}))
    link = link_from_tuning_table(path)
    assert link.latency_s == pytest.approx(5e-6, rel=1e-6)
    assert link.bandwidth_Bps == pytest.approx(1e9, rel=1e-6)
