"""The hooks name the framework versions they were tested with, and refuse a DeepSpeed that no
longer fits them with a clear error (no process group needed: these read signatures only)."""

import os
import warnings

import pytest
import torch

from mcr.hooks import versions

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def test_the_installed_torch_and_deepspeed_are_inside_the_tested_ranges():
    import deepspeed

    assert versions.untested_message("torch", torch.__version__) is None
    assert versions.untested_message("deepspeed", deepspeed.__version__) is None


@pytest.mark.parametrize(
    "package, version",
    [("torch", "2.16.0"), ("torch", "1.13.1"), ("torch", "2.10.0"), ("deepspeed", "0.20.0"), ("deepspeed", "0.18")],
)
def test_an_untested_version_gets_a_message_naming_the_range_and_what_to_do(package, version):
    low, high = versions.TESTED[package][-1]  # the newest range is the one to install
    message = versions.untested_message(package, version)
    assert message is not None
    assert f"{package} {version} is outside" in message
    assert f"pip install '{package}>={low},<{high}'" in message
    assert "mcr/hooks/versions.py" in message


@pytest.mark.parametrize(
    "version", ["2.11.0+cu130", "2.12.1+cu130", "2.13.0+cpu", "2.14.1+cu130", "2.14.0", "2.15.0+cu132"]
)
def test_each_tested_torch_release_and_its_patch_releases_are_inside(version):
    assert versions.untested_message("torch", version) is None


def test_warn_if_untested_warns_once_per_call_with_the_message():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.warn_if_untested("deepspeed", "0.21.3")
        versions.warn_if_untested("deepspeed", "0.19.9")  # a later patch release of the tested one
    assert [w.category for w in caught] == [versions.UntestedVersionWarning]
    assert str(caught[0].message) == versions.untested_message("deepspeed", "0.21.3")


def test_release_reads_local_and_dev_suffixes():
    assert versions.release("2.13.0+cpu") == (2, 13, 0)
    assert versions.release("2.14.0.dev20260101") == (2, 14, 0)
    with pytest.raises(ValueError, match="not a version"):
        versions.release("nightly")


def test_group_positions_are_read_from_deepspeeds_signatures():
    from mcr.hooks import deepspeed as hook

    backend = hook._backend_class()
    positions = hook._group_positions(backend)
    # DeepSpeed 0.19.8's signatures, most of them behind its stage_on_cpu decorator
    assert positions["all_reduce"] == 2  # (tensor, op, group, async_op)
    assert positions["reduce_scatter_tensor"] == 3  # (output, input, op, group, async_op)
    assert positions["all_to_all_single"] == 4  # (output, input, out_splits, in_splits, group, ...)
    assert positions["barrier"] == 0  # (group, async_op, device_ids)
    assert set(positions) == set(hook._GROUP_OPS)

    class Reordered(backend):
        def all_reduce(self, tensor, group=None, op=None, async_op=False):
            pass

    assert hook._group_positions(Reordered)["all_reduce"] == 1


def test_a_deepspeed_op_without_group_fails_with_a_message_naming_it():
    from mcr.hooks import deepspeed as hook

    class NoGroup(hook._backend_class()):
        def send(self, tensor, dst, tag=0, **kwargs):
            pass

    with pytest.raises(RuntimeError, match=r"TorchBackend\.send\(self, tensor, dst, tag=0, \*\*kwargs\) has no"):
        hook._group_positions(NoGroup)
