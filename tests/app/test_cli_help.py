"""Every `sqa` command explains itself: a description and a working example in its --help."""

from __future__ import annotations

import shlex

import pytest
import typer.main
from typer.testing import CliRunner

from app.cli import cli


def _leaf_commands(group, prefix: tuple[str, ...] = ()):
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):  # a group (typer's own click)
            yield from _leaf_commands(command, prefix + (name,))
        else:
            yield prefix + (name,), command


ROOT = typer.main.get_command(cli)
COMMANDS = list(_leaf_commands(ROOT))


def test_the_walk_finds_every_command_group():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"ingest", "ask", "serve", "jobs show", "train reader", "import realtimeqa", "index status"} <= names
    assert len(names) >= 30


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_has_a_description_and_an_example_that_parses(path, command):
    assert (command.help or "").strip(), f"sqa {' '.join(path)} has no description"
    epilog = (command.epilog or "").strip()
    assert epilog.startswith("Example: "), f"sqa {' '.join(path)} has no example"
    argv = shlex.split(epilog.removeprefix("Example: "))
    assert argv[: 1 + len(path)] == ["sqa", *path], f"the example runs another command: {epilog}"
    # the example's arguments are ones the command takes (parsed, not run)
    command.make_context(" ".join(path), argv[1 + len(path) :])

    shown = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert shown.exit_code == 0
    assert "Example: sqa" in shown.output


def test_sqa_help_loads_no_database_or_model_library():
    """`sqa --help` (and every command's --help) imports the CLI only: a command module keeps its
    heavy imports inside the command (the `# noqa: PLC0415 (lazy: ...)` ones)."""
    import subprocess
    import sys

    heavy = ("sqlalchemy", "numpy", "alembic", "torch", "faiss", "transformers", "apscheduler")
    code = f"import sys, app.cli; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
