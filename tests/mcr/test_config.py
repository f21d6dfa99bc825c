"""Bad runtime settings fail with a message naming the key and the choices."""

import pytest

from mcr.config import ConfigError, load


def test_env_overrides_per_op_and_default():
    cfg = load(env={"MCR_BACKEND": "gloo", "MCR_BACKEND_ALL_TO_ALL": "mpi", "MCR_COMM_LOG": "1"})
    assert cfg.backend == "gloo" and cfg.overrides == {"all_to_all": "mpi"} and cfg.comm_log


def test_keyword_beats_environment():
    assert load(env={"MCR_BACKEND": "gloo"}, backend="mpi").backend == "mpi"


def test_unknown_backend_names_the_choices():
    with pytest.raises(ConfigError, match=r"unknown backend 'ucc'.*choose one of mpi, gloo, nccl"):
        load(env={"MCR_BACKEND": "ucc"})


def test_node_aware_candidates_are_accepted_where_an_ops_choice_is_named_and_checked_part_by_part():
    cfg = load(env={"MCR_BACKEND_ALL_REDUCE": "node:mpi+gloo", "MCR_BACKEND": "node:gloo+mpi"})
    assert cfg.overrides == {"all_reduce": "node:mpi+gloo"} and cfg.backend == "node:gloo+mpi"
    with pytest.raises(ConfigError, match=r"unknown backend 'ucc' in 'node:mpi\+ucc' in the override for all_reduce"):
        load(env={"MCR_BACKEND_ALL_REDUCE": "node:mpi+ucc"})
    with pytest.raises(ConfigError, match=r"a node-aware one is node:INTRA\+INTER, e.g. node:mpi\+gloo"):
        load(env={"MCR_BACKEND": "node:mpi"})
    with pytest.raises(ConfigError, match="unknown backend 'node:mpi\\+gloo' in backends"):
        load(env={"MCR_BACKENDS": "node:mpi+gloo"})  # the backends to start are libraries, not candidates


def test_unknown_op_override_names_the_ops():
    with pytest.raises(ConfigError, match=r"unknown op 'allreduce'.*MCR_BACKEND_ALLREDUCE.*all_reduce"):
        load(env={"MCR_BACKEND_ALLREDUCE": "mpi"})


def test_unknown_environment_variable_is_an_error_and_backends_has_one():
    with pytest.raises(ConfigError, match=r"unknown environment variable MCR_WATCHDOG_TIMOUT; mcr reads MCR_BACKEND,"):
        load(env={"MCR_WATCHDOG_TIMOUT": "10", "MCR_BACKEND": "gloo"})
    assert load(env={"MCR_BACKENDS": "mpi"}).backends == "mpi"


def test_unknown_config_key_is_an_error():
    with pytest.raises(ConfigError, match="comm_logg"):
        load({"comm_logg": True}, env={})


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("MCR_WATCHDOG_TIMEOUT", "abc", r"bad value 'abc' for MCR_WATCHDOG_TIMEOUT: give a number of seconds"),
        ("MCR_COMM_LOG", "maybe", r"bad value 'maybe' for MCR_COMM_LOG: use 1 or 0"),
        ("MCR_TUNING_PREDICT", "2", r"bad value '2' for MCR_TUNING_PREDICT: use 1 or 0"),
    ],
)
def test_a_bad_environment_value_names_the_variable(var, value, message):
    with pytest.raises(ConfigError, match=message):
        load(env={var: value})


def test_environment_flags_and_numbers_are_parsed():
    cfg = load(env={"MCR_COMM_LOG": "off", "MCR_TUNING_PREDICT": "yes", "MCR_WATCHDOG_TIMEOUT": "2.5"})
    assert (cfg.comm_log, cfg.tuning_predict, cfg.watchdog_timeout_s) == (False, True, 2.5)


def test_cuda_aware_mpi_and_nccl_take_turns_unless_told_to_run_side_by_side():
    assert load(env={}).mpi_nccl_concurrent is False
    assert load(env={"MCR_MPI_NCCL_CONCURRENT": "1"}).mpi_nccl_concurrent is True
    with pytest.raises(ConfigError, match=r"bad value 'sometimes' for MCR_MPI_NCCL_CONCURRENT: use 1 or 0"):
        load(env={"MCR_MPI_NCCL_CONCURRENT": "sometimes"})


@pytest.mark.parametrize(
    "config,message",
    [
        ({"watchdog_timeout_s": "soon"}, r"watchdog_timeout_s"),
        ({"comm_log": "sometimes"}, r"comm_log"),
        ({"backends": "mpi,ucx"}, r"unknown backend 'ucx' in backends; choose one of mpi, gloo, nccl"),
        ({"overrides": {"all_reduce": "shm"}}, r"unknown backend 'shm' in the override for all_reduce"),
    ],
)
def test_a_bad_config_value_names_the_key(config, message):
    with pytest.raises(ConfigError, match=message):
        load(config, env={})
