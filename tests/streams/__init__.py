"""The CPU tier of the stream and device rules: a stand-in for CUDA (`cuda_model`) under real ranks."""

import time


def wait_for(condition, timeout) -> bool:
    """True once `condition()` holds (checked every millisecond), False after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    return True


def mcr_calls(call) -> list:
    """The Python functions in mcr that `call()` enters ("file.py:function", in order): what a
    made route costs on the host (run it once before, so the route is made)."""
    import sys

    import mcr

    mcr_dir, calls = mcr.__path__[0], []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(mcr_dir):
            calls.append(f"{frame.f_code.co_filename[len(mcr_dir) + 1 :]}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return calls


def scenarios(result, tag: str):
    """A function of a scenario's name giving what each of the 2 ranks of `result` reported for it
    under `tag`, failing where a rank reported nothing or an error."""
    found = result.tagged(tag)

    def scenario(name):
        per_rank = [found.get(f"{rank} {name}") for rank in (0, 1)]
        assert all(per_rank), f"{name}: a rank reported nothing:\n{result.output[-3000:]}"
        for value in per_rank:
            assert "error" not in value, f"{name}: {value['error']}"
        return per_rank

    return scenario
