import itertools

import pytest
from conftest import make_cluster, random_profile

from bapipe.explore import (
    SCHEDULES,
    CostModel,
    InfeasibleError,
    baseline_plan,
    brute_force_plan,
    data_parallel_plan,
    deepspeed_partition,
    optimal_plan,
    search,
)
from bapipe.profile import LayerProfile, Profile


def test_dynamic_programme_matches_brute_force_on_random_instances(rng):
    checked = 0
    for _ in range(60):
        layers = rng.randint(2, 8)
        stages = rng.randint(1, min(4, layers))
        profile = random_profile(rng, layers)
        cluster = make_cluster(
            stages,
            memory=[rng.uniform(1e8, 6e8) for _ in range(stages)],
            speed=[rng.choice([0.5, 1.0, 2.0]) for _ in range(stages)],
            latency=rng.uniform(0, 1e-3),
            bandwidth=rng.uniform(1e8, 1e10),
        )
        model = CostModel(profile, cluster, stages, rng.randint(1, 8), rng.choice(SCHEDULES))
        try:
            expected = brute_force_plan(model)
        except InfeasibleError:
            with pytest.raises(InfeasibleError):
                optimal_plan(model)
            continue
        plan = optimal_plan(model)
        assert plan.iteration_s == pytest.approx(expected.iteration_s, rel=1e-12)
        checked += 1
    assert checked > 30  # most instances are feasible, so the comparison really ran


def test_plan_respects_each_stage_memory(rng):
    profile = random_profile(rng, 8)
    free = optimal_plan(CostModel(profile, make_cluster(3), 3, 8, "gpipe"))
    # squeeze memory just below what the unconstrained optimum uses on its biggest stage
    limit = max(s.memory_bytes for s in free.stages) * 0.999
    plan = optimal_plan(CostModel(profile, make_cluster(3, memory=limit), 3, 8, "gpipe"))
    assert plan.boundaries != free.boundaries
    assert all(s.memory_bytes <= limit for s in plan.stages)
    assert plan.iteration_s >= free.iteration_s


def test_no_stage_is_empty_even_when_one_layer_dominates():
    layers = [LayerProfile("huge", 1.0, 2.0, 0, 0, 10)] + [
        LayerProfile(f"t{i}", 1e-3, 2e-3, 0, 0, 10) for i in range(4)
    ]
    plan = optimal_plan(CostModel(Profile(layers), make_cluster(5), 5, 4, "1f1b"))
    assert [(s.start, s.stop) for s in plan.stages] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    with pytest.raises(ValueError, match="cannot be empty"):
        CostModel(Profile(layers), make_cluster(6), 6, 4, "1f1b")


def test_infeasible_request_names_the_smallest_memory_that_fits(rng):
    profile = random_profile(rng, 6)
    model = CostModel(profile, make_cluster(3, memory=1.0), 3, 4, "1f1b")
    with pytest.raises(InfeasibleError, match="smallest device memory that would fit") as err:
        optimal_plan(model)
    needed = min(
        max(model.memory_bytes(s, a, b) for s, (a, b) in enumerate(zip((0,) + cut, cut + (6,))))
        for cut in itertools.combinations(range(1, 6), 2)
    )
    assert err.value.needed_bytes == pytest.approx(needed)
    fits = optimal_plan(CostModel(profile, make_cluster(3, memory=needed), 3, 4, "1f1b"))
    assert max(s.memory_bytes for s in fits.stages) <= needed


def test_in_flight_activations_follow_the_schedule():
    layers = [LayerProfile(f"l{i}", 1e-3, 2e-3, 0, 1000, 10) for i in range(4)]
    gpipe = CostModel(Profile(layers), make_cluster(4), 4, 6, "gpipe").plan([0, 1, 2, 3])
    one_f_one_b = CostModel(Profile(layers), make_cluster(4), 4, 6, "1f1b").plan([0, 1, 2, 3])
    assert [s.memory_bytes for s in gpipe.stages] == [6000] * 4
    assert [s.memory_bytes for s in one_f_one_b.stages] == [4000, 3000, 2000, 1000]  # min(p - s, m)


def test_heavy_output_head_moves_layers_to_the_first_stage():
    # the GPT-like pitfall: a uniform split leaves the head's stage the slowest
    layers = (
        [LayerProfile("embed", 1e-4, 2e-4, 8_000_000, 0, 1000)]
        + [LayerProfile(f"block{i}", 1e-2, 2e-2, 3_000_000, 1000, 1000) for i in range(8)]
        + [LayerProfile("head", 3e-2, 6e-2, 8_000_000, 1000, 0)]
    )
    model = CostModel(Profile(layers), make_cluster(2), 2, 8, "1f1b")
    plan = optimal_plan(model)
    uniform = baseline_plan(model, "uniform")
    assert deepspeed_partition(Profile(layers), 2, "uniform") == [0, 5, 10]
    assert plan.deepspeed_parts == [0, 6, 10]
    assert plan.iteration_s < uniform.iteration_s


def test_slow_device_gets_fewer_layers():
    layers = [LayerProfile(f"l{i}", 1e-3, 2e-3, 0, 0, 10) for i in range(9)]
    plan = optimal_plan(CostModel(Profile(layers), make_cluster(2, speed=[2.0, 1.0]), 2, 8, "1f1b"))
    assert plan.deepspeed_parts == [0, 6, 9]


def test_data_parallel_holds_the_whole_model_and_one_micro_batch():
    layers = [LayerProfile(f"l{i}", 1e-3, 2e-3, 4_000, 500, 10) for i in range(4)]
    plan = data_parallel_plan(Profile(layers), make_cluster(4), 4, 3)
    assert plan.stages[0].memory_bytes == 4 * 4_000 * 4 + 4 * 500
    assert plan.iteration_s == pytest.approx(3 * 4 * 3e-3, rel=1e-9)  # no all-reduce cost on an ideal link


def test_search_prefers_pipelining_when_data_parallel_does_not_fit():
    layers = [LayerProfile(f"l{i}", 1e-3, 2e-3, 1_000_000, 1000, 1000) for i in range(8)]
    cluster = make_cluster(4, memory=9_000_000)  # a whole model's state (32 MB) fits nowhere
    best, tried = search(Profile(layers), cluster, max_microbatches=16)
    assert len(best.stages) == 4 and all(p.schedule != "data-parallel" for p in tried)
