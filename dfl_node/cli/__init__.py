"""The `dfl-node` command line: one verb per job."""

from __future__ import annotations

from typing import Any

import click

from dfl_node import __version__
from dfl_node.cli.certs import certs
from dfl_node.cli.logs import log_options
from dfl_node.cli.node_cmds import partition, start, status, stop
from dfl_node.cli.plot import plot
from dfl_node.cli.simulate import simulate
from dfl_node.cli.sweep import sweep
from dfl_node.cli.testbed import testbed
from dfl_node.config import OperatorError
from dfl_node.learning.datasets import DatasetNotFoundError


class OperatorErrors(click.Group):
    """Every verb reports an operator's mistake the same way: ``error: …`` on stderr, exit 1, no traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (OperatorError, DatasetNotFoundError) as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(1)


@click.group(cls=OperatorErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dfl-node")
@log_options
def cli() -> None:
    """dfl-node: decentralized federated learning for IoT fleets, with no central server."""


for command in (simulate, testbed, start, stop, partition, status, plot, sweep, certs):
    cli.add_command(log_options(command))


def main() -> None:
    cli()
