"""mcr.files.write_atomic: whole files, with the permissions a plain open() would give them."""

import os
import subprocess
import sys

from mcr.files import write_atomic


def test_write_atomic_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "table.yaml"
    write_atomic(str(path), "old\n")
    write_atomic(str(path), b"new\n")
    assert path.read_bytes() == b"new\n"
    assert os.listdir(tmp_path) == ["table.yaml"]


def test_write_atomic_files_get_the_mode_open_gives_under_the_umask(tmp_path):
    # mkstemp's 0600 would make a tuning table or a flight record unreadable to the rest of a
    # cluster's users; run under two umasks in fresh processes (the module reads it once)
    for umask, want in ((0o022, 0o644), (0o002, 0o664)):
        path = tmp_path / f"written-{umask:o}"
        code = f"import os; os.umask({umask}); from mcr.files import write_atomic; write_atomic({str(path)!r}, 'x')"
        subprocess.run([sys.executable, "-c", code], check=True)
        assert path.stat().st_mode & 0o777 == want, oct(path.stat().st_mode)
