"""Every command in README.md and docs/*.md works as written (tests/readme_commands.py finds and
checks them; `python -m tests.readme_commands` prints the same report by hand)."""

import pytest

from tests import readme_commands as rc

COMMANDS = rc.all_commands()
IDS = [f"{cmd.where} {cmd.text[:60]}" for cmd in COMMANDS]


def test_the_docs_hold_commands_and_the_quick_start_is_two():
    quick = [cmd.text.split("#")[0].strip() for cmd in rc.commands_in(rc.ROOT / "README.md")[:2]]
    assert quick == ["make run", "make test"]
    assert len(COMMANDS) > 50, "the command finder lost the code blocks"
    assert any(cmd.doc.startswith("docs/") for cmd in COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_command_names_modules_targets_and_files_that_exist(cmd):
    assert rc.name_problems(cmd) == []


@pytest.fixture(scope="module")
def parsed():
    """Each program's parser over its arguments as written, all in one child process."""
    pairs = [pair for cmd in COMMANDS for pair in rc.parse_pairs(cmd)]
    return dict(zip(map(repr, pairs), rc.parse_all(pairs)))


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_command_arguments_are_accepted(cmd, parsed):
    refused = {f"python -m {m}": parsed[repr((m, a))] for m, a in rc.parse_pairs(cmd) if parsed[repr((m, a))]}
    assert refused == {}, cmd.where


CHEAP = [cmd for cmd in COMMANDS if rc.cheap_argv(cmd, "runs") is not None]


def test_some_commands_are_cheap_enough_to_run():
    assert len(CHEAP) >= 5


@pytest.mark.parametrize("cmd", CHEAP, ids=[f"{c.where} {c.text[:60]}" for c in CHEAP])
def test_cheap_command_runs_as_written(cmd, tmp_path):
    assert rc.run_cheap(cmd, str(tmp_path)) is None


@pytest.mark.parametrize("path", rc.DOCS, ids=[p.name for p in rc.DOCS])
def test_links_and_paths_in_the_prose_exist(path):
    assert rc.prose_problems(path) == []
