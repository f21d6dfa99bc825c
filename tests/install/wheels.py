"""Wheel files that carry only a name, a version and their requirements, in a PEP 503 index on
disk: for tests of how pip resolves and keeps packages (the real torch and fbgemm-gpu wheels
weigh gigabytes). They hold no code; nothing imports them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile


def metadata_only_wheel(folder: str, name: str, version: str, requires=()) -> str:
    """A py3-none-any wheel of `name` `version` (a local label like +cu126 allowed)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = os.path.join(folder, f"{dist}-py3-none-any.whl")
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    wheel = "Wheel-Version: 1.0\nGenerator: tests.install.wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {f"{dist}.dist-info/METADATA": metadata, f"{dist}.dist-info/WHEEL": wheel}
    record = "".join(f"{member},,\n" for member in files) + f"{dist}.dist-info/RECORD,,\n"
    os.makedirs(folder, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for member, text in {**files, f"{dist}.dist-info/RECORD": record}.items():
            z.writestr(member, text)
    return path


def simple_index(root: str, wheels: dict) -> str:
    """A PEP 503 index under `root` ({name: [(version, requires), ...]}); its file:// URL."""
    for name, releases in wheels.items():
        project = os.path.join(root, name)
        links = [os.path.basename(metadata_only_wheel(project, name, v, r)) for v, r in releases]
        with open(os.path.join(project, "index.html"), "w") as f:
            f.write("".join(f'<a href="{link}">{link}</a><br>\n' for link in links))
    return "file://" + os.path.abspath(root)


def pip_env() -> dict:
    """This environment without the pip settings of this machine (its find-links folder of real
    wheels, its extra indexes, its constraints): pip sees only the indexes a test names."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return dict(env, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")


def pip(python: str, *args) -> subprocess.CompletedProcess:
    """pip, run by this Python, on the environment of `python` (pip's --python)."""
    cmd = [sys.executable, "-m", "pip", "--python", python, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=pip_env(), timeout=300)
