"""The CLI as the tests run it: a verb in-process (:func:`invoke`), its click command, the error lines of its
output, and what the tests read off its output."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner, Result

from dfl_node.cli import cli

# The shortest ``dfl-node start`` command line that names a node: its id and its data.
START = ("start", "--id", "node-0", "--data", "shards/node-0")


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """``dfl-node ARGS`` in-process; an exception of ours propagates (a traceback is a bug, not an error line)."""
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def verb_command(name: str) -> click.Command:
    """The click command of ``dfl-node NAME`` (the group imports each verb on first use)."""
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def error_lines(result: Result) -> list[str]:
    """The lines that report the problem: click's ``Error: …`` and ours ``error: …``, nothing else."""
    assert "Traceback" not in result.output
    return [line for line in result.output.splitlines() if line.lower().startswith("error: ")]


def summary_rounds(stdout: str) -> int:
    """The "rounds" cell of the summary table's testbed row (algorithm | driver | rounds | …)."""
    rows = [line for line in stdout.splitlines() if re.search(r"defkt\s*│\s*testbed", line)]
    assert len(rows) == 1, stdout
    return int(rows[0].split("│")[3])
