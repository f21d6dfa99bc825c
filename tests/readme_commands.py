"""The commands in README.md and docs/*.md, found and checked (tests/test_readme_commands.py runs it).

    python -m tests.readme_commands        # every command: where it is, what was checked, what failed

A command is a line of a code block (```sh, bash, shell, console or unmarked, or an indented
block), or an inline `code span` in the prose, that starts (after `$ ` and `VAR=value`
prefixes) with python, .venv/bin/python, make, torchrun, mpiexec, srun, sbatch or torchfrtrace.
`# comments`, `\\` continuations and `[optional]` brackets are read as a shell and a reader
would. Each command is checked three ways:

- names: every `python -m MODULE` is importable (importlib.util.find_spec), every `make TARGET`
  and `VAR=` is in the Makefile, every executable is in the venv, and every path under a
  directory of the repository exists;
- arguments: each module's own argparse parser reads the arguments as written (stopped right
  after parsing, nothing runs), in one process (`--parse`); a trainer's preset and `key=value`
  overrides are loaded by its config schema (`apps.common.config.load_config`);
- running: the cheap ones run as written (explain, tune --table, bapipe plan, launch script and
  launch submit --dry-run, with --out in a temporary directory) and must exit 0.

`<placeholder>`s and upper-case module names (MODULE) are not checked where they stand.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_WORDS = ("python", ".venv/bin/python", "make", "torchrun", "mpiexec", "srun", "sbatch", "torchfrtrace")
SHELL_LANGS = ("", "sh", "bash", "shell", "console")
SCHEDULERS = ("mpiexec", "srun", "sbatch")  # on a cluster, not in the venv: their arguments are theirs
PLACEHOLDER = "PLACEHOLDER"
# modules whose main reads sys.argv without argparse, or another program's parser: named, not parsed
NOT_PARSED = {"pytest", "tests.conformance.summary", "tests.readme_commands"}
# (module, first arguments) of the commands cheap enough to run as written
CHEAP = [
    ("mcr.tools.explain",),
    ("mcr.tools.tune", "--table"),
    ("bapipe", "plan"),
    ("launch", "script"),
    ("launch", "submit"),
]
ENV_PREFIX = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass
class Command:
    doc: str  # README.md or docs/x.md
    line: int
    text: str  # as written, continuations joined
    argv: list = field(default_factory=list)  # the words, env prefixes and comments out
    env: dict = field(default_factory=dict)
    placeholder: bool = False

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


# --- finding the commands ---------------------------------------------------------------------


def _is_command(line: str) -> bool:
    words = line.split()
    while words and ENV_PREFIX.match(words[0]):
        words = words[1:]
    if not words or words[0] not in COMMAND_WORDS:
        return False
    return words[0] not in ("python", ".venv/bin/python") or (words[1:2] == ["-m"] and len(words) > 2)


def _command(doc: str, lineno: int, text: str) -> Command | None:
    text = text.strip()
    if text.startswith("$ "):
        text = text[2:]
    if not _is_command(text):
        return None
    cmd = Command(doc, lineno, text)
    marked = re.sub(r"<[^<>]*>", PLACEHOLDER, text)
    cmd.placeholder = marked != text
    try:
        words = shlex.split(marked.replace("[", " ").replace("]", " "), comments=True)
    except ValueError:
        words = marked.split()
    for i, word in enumerate(words):
        if word in ("|", "&&", ";", ">", ">>"):
            words = words[:i]
            break
    while words and ENV_PREFIX.match(words[0]):
        key, value = words.pop(0).split("=", 1)
        cmd.env[key] = value
    cmd.argv = words
    return cmd


def _blocks(lines):
    """(first line number, lines, language) of each fenced or indented code block."""
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\w*)", lines[i])
        if fence:
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            yield i + 2, lines[i + 1 : j], fence.group(1)
            i = j + 1
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            yield i + 1, lines[i:j], ""
            i = j
        else:
            i += 1


def commands_in(path: Path) -> list:
    doc = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    found, in_block = [], set()
    for first, block, lang in _blocks(lines):
        in_block.update(range(first, first + len(block)))
        if lang not in SHELL_LANGS:
            continue
        k = 0
        while k < len(block):
            start, text = first + k, block[k]
            while text.rstrip().endswith("\\") and k + 1 < len(block):
                k += 1
                text = text.rstrip()[:-1] + " " + block[k].strip()
            cmd = _command(doc, start, text)
            if cmd:
                found.append(cmd)
            k += 1
    for n, line in enumerate(lines, 1):
        if n in in_block:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            cmd = _command(doc, n, span)
            if cmd:
                found.append(cmd)
    return found


def all_commands() -> list:
    return [cmd for path in DOCS for cmd in commands_in(path)]


# --- what a command runs ----------------------------------------------------------------------


def _is_placeholder(name: str) -> bool:
    return PLACEHOLDER in name or name.isupper()


def programs(cmd: Command) -> list:
    """(module, argv) of each Python program the command starts: the launcher's and the one it
    launches (`launch.local ... -m M args`, `torchrun ... -m M args`), the trainer after `--` of
    `launch script/submit/sweep`."""
    words = list(cmd.argv)
    if not words or words[0] in ("make", "torchfrtrace") or words[0] in SCHEDULERS:
        return []
    if words[0] == "torchrun":
        words = ["python", "-m", "torch.distributed.run"] + words[1:]
    module, args = words[2], words[3:]
    found = [(module, args)]
    if module in ("launch.local", "torch.distributed.run") and "-m" in args:
        at = args.index("-m")
        found.append((args[at + 1], args[at + 2 :]))
    if module == "launch" and "--" in args:
        own, rest = args[: args.index("--")], args[args.index("--") + 1 :]
        if args[:1] == ["sweep"] and "--app" in own:
            found.append((f"apps.{own[own.index('--app') + 1]}", rest))
        elif rest:
            found.append((f"apps.{rest[0]}", rest[1:]))
    return [(m, a) for m, a in found if not _is_placeholder(m)]


def trainer_app(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) == 2 and parts[0] == "apps" and parts[1] != "common" else None


# --- names: modules, make targets, executables, paths ----------------------------------------


def _repo_dirs() -> set:
    return {p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in (".venv", "runs", ".git")}


def path_problems(words, doc: str) -> list:
    """Words that name a path under a directory of the repository that is not there."""
    dirs, problems = _repo_dirs(), []
    for word in words:
        for token in [word, word.split("=", 1)[-1]]:
            token = token.rstrip(".,;:)")
            if "/" not in token or PLACEHOLDER in token or any(c in token for c in "<>{}*?$…"):
                continue
            if token.split("/", 1)[0] in dirs and not (ROOT / token).exists():
                problems.append(f"{doc}: no such file in the repository: {token}")
    return sorted(set(problems))


def name_problems(cmd: Command) -> list:
    problems = []
    words = cmd.argv
    if not words:
        return [f"{cmd.where}: nothing to run in {cmd.text!r}"]
    if words[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        for word in words[1:]:
            if word.startswith("-"):
                continue
            name = word.split("=", 1)[0]
            pattern = rf"^{re.escape(name)} *(\?|:)?=" if "=" in word else rf"^{re.escape(name)}:"
            if not re.search(pattern, makefile, re.M):
                kind = "variable" if "=" in word else "target"
                problems.append(f"{cmd.where}: the Makefile has no {kind} {name!r}: {cmd.text}")
    elif words[0] in ("torchrun", "torchfrtrace"):
        if not (Path(sys.executable).parent / words[0]).exists():
            problems.append(f"{cmd.where}: {words[0]} is not installed in {Path(sys.executable).parent}")
    if words[0] not in ("make", "torchfrtrace") and words[0] not in SCHEDULERS:
        if words[0] != "torchrun" and (len(words) < 3 or words[1] != "-m"):
            problems.append(f"{cmd.where}: not a `python -m MODULE` command: {cmd.text}")
            return problems
        for module, _ in programs(cmd):
            try:
                spec = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                problems.append(f"{cmd.where}: no module named {module!r}: {cmd.text}")
    if not cmd.placeholder:
        problems += [f"{p} ({cmd.text})" for p in path_problems(cmd.argv, cmd.where)]
    return problems


def prose_problems(path: Path) -> list:
    """Links to files and `repo/paths` in the prose that are not there."""
    doc, text = str(path.relative_to(ROOT)), path.read_text()
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("#"):
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            problems.append(f"{doc}: the link {target} leads nowhere")
    words = [w for span in re.findall(r"`([^`]+)`", text) for w in span.split()]
    return problems + path_problems(words, doc)


# --- arguments: each program's own parser -----------------------------------------------------


class _Parsed(BaseException):
    """Raised right after a program's parser accepted its arguments: nothing else runs."""


def _stop_after_parsing() -> None:
    depth = [0]

    def wrap(method):
        def parse(self, *args, **kwargs):
            depth[0] += 1
            try:
                result = method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise _Parsed()
            return result

        return parse

    for name in ("parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args"):
        setattr(argparse.ArgumentParser, name, wrap(getattr(argparse.ArgumentParser, name)))


def _parse_one(module: str, args: list) -> str | None:
    """None if `module`'s parser (or a trainer's config) reads `args`, else what it said."""
    app = trainer_app(module)
    if app:
        from apps.common.config import ConfigError, load_config
        from apps.common.trainer_config import TrainerConfig

        config = importlib.import_module(f"apps.{app}.config")
        schemas = [
            c
            for c in vars(config).values()
            if isinstance(c, type) and issubclass(c, TrainerConfig) and c.__module__ == config.__name__
        ]
        try:
            load_config(schemas[0], args)
        except ConfigError as exc:
            return str(exc)
        return None
    argv, sys.argv = sys.argv, [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed:
        return None
    except ImportError as exc:
        return str(exc)
    except SystemExit as exc:
        if exc.code in (0, None):
            return None  # --help
        return f"its parser refused the arguments (exit status {exc.code})"
    finally:
        sys.argv = argv
    return "it ran without parsing its arguments with argparse: list it in NOT_PARSED"


def parse_all(pairs: list) -> list:
    """[(module, args)] -> [None or a problem], each parsed in one child process (one import of torch)."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.readme_commands", "--parse"],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    results = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or len(results) != 1:
        raise RuntimeError(f"the parse check failed (exit status {out.returncode}):\n{out.stdout}\n{out.stderr}")
    return json.loads(results[0][len("RESULT ") :])


def _parse_main() -> int:
    _stop_after_parsing()
    pairs = json.loads(sys.stdin.read())
    results = []
    for module, args in pairs:
        print(f"== python -m {module} {shlex.join(args)}", file=sys.stderr, flush=True)
        results.append(_parse_one(module, args))
    print("RESULT " + json.dumps(results), flush=True)
    return 0


def parse_pairs(cmd: Command) -> list:
    return [(m, a) for m, a in programs(cmd) if m not in NOT_PARSED]


# --- running the cheap ones -------------------------------------------------------------------


def cheap_argv(cmd: Command, out_dir: str) -> list | None:
    """The argv to run `cmd` as written (launch with --out in out_dir, submit with --dry-run),
    or None when it is not cheap or names a placeholder or an input that is not there."""
    words = cmd.argv
    if cmd.placeholder or words[:2] != ["python", "-m"] or cmd.text.count("[") or cmd.env:
        return None
    if not any(tuple(words[2 : 2 + len(prefix)]) == prefix for prefix in CHEAP):
        return None
    for word in words:
        if word.endswith((".json", ".yaml")) and not (ROOT / word).exists():
            return None  # an input the reader makes first (bapipe profile --out gpt.json)
    argv = [sys.executable, *words[1:]]
    if words[2] == "launch":
        at = argv.index("--") if "--" in argv else len(argv)
        extra = ["--out", out_dir, "--quiet"] + (["--dry-run"] if words[3] == "submit" else [])
        argv = argv[:at] + extra + argv[at:]
    return argv


def run_cheap(cmd: Command, out_dir: str) -> str | None:
    argv = cheap_argv(cmd, out_dir)
    if argv is None:
        return None
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    if done.returncode != 0:
        return f"{cmd.where}: `{cmd.text}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--parse"]:
        return _parse_main()
    commands = all_commands()
    pairs = [p for cmd in commands for p in parse_pairs(cmd)]
    parsed = iter(parse_all(pairs))
    failed = 0
    for cmd in commands:
        problems = name_problems(cmd)
        for module, _ in parse_pairs(cmd):
            said = next(parsed)
            if said:
                problems.append(f"{cmd.where}: python -m {module}: {said}")
        ran = run_cheap(cmd, os.path.join(ROOT, "runs", "readme-commands"))
        if ran:
            problems.append(ran)
        status = "FAIL" if problems else ("ran" if cheap_argv(cmd, "runs") else "ok")
        print(f"{status:4}  {cmd.where:28} {cmd.text}")
        for problem in problems:
            print(f"      {problem}")
        failed += bool(problems)
    for path in DOCS:
        for problem in prose_problems(path):
            print(f"FAIL  {problem}")
            failed += 1
    print(f"{len(commands)} commands in {len(DOCS)} files, {failed} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
