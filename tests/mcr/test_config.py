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


def test_unknown_op_override_names_the_ops():
    with pytest.raises(ConfigError, match=r"unknown op 'allreduce'.*MCR_BACKEND_ALLREDUCE.*all_reduce"):
        load(env={"MCR_BACKEND_ALLREDUCE": "mpi"})


def test_unknown_config_key_is_an_error():
    with pytest.raises(ConfigError, match="comm_logg"):
        load({"comm_logg": True}, env={})
