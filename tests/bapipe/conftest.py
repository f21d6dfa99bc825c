import random

import pytest

from bapipe.cluster import Cluster
from bapipe.profile import LayerProfile, Profile


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts a real 2-process DeepSpeed pipeline (about a minute)")


def make_cluster(devices, memory=1e12, speed=1.0, latency=0.0, bandwidth=1e30, **extra):
    speeds = speed if isinstance(speed, list) else [speed] * devices
    memories = memory if isinstance(memory, list) else [memory] * devices
    return Cluster.from_dict(
        {
            "devices": [{"memory_bytes": mem, "speed": s} for mem, s in zip(memories, speeds)],
            "link": {"latency_s": latency, "bandwidth_Bps": bandwidth},
            **extra,
        }
    )


def random_profile(rng: random.Random, layers):
    return Profile(
        [
            LayerProfile(
                f"l{i}",
                rng.uniform(1, 10) * 1e-3,
                rng.uniform(1, 20) * 1e-3,
                rng.randint(0, 10) * 4_000_000,
                rng.randint(0, 10) * 1_000_000,
                rng.randint(1, 10) * 100_000,
                optimizer_s=rng.uniform(0, 2) * 1e-3,
            )
            for i in range(layers)
        ]
    )


@pytest.fixture
def rng():
    return random.Random(1234)
