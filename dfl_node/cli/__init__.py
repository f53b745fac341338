"""The `dfl-node` command line: one verb per job, each imported only when it runs, so that ``dfl-node --help``,
``status`` and ``stop`` import neither torch nor the node (a status query on a small device costs its HTTP
request, not 2 s and 250 MB of torch)."""

from __future__ import annotations

import gc
import importlib
from typing import Any

import click

from dfl_node import __version__
from dfl_node.cli.logs import log_options
from dfl_node.errors import OperatorError
from dfl_node.plugins import PluginError

# Each verb: where it lives, and the line `dfl-node --help` shows for it without importing it (a test checks
# that the line opens the verb's own help).
VERBS: dict[str, tuple[str, str]] = {
    "simulate": ("dfl_node.cli.simulate:simulate", "Run K real nodes in one process"),
    "testbed": ("dfl_node.cli.testbed:testbed", "Run a fleet of real daemons on this machine"),
    "start": ("dfl_node.cli.node_cmds:start", "Run this device's node"),
    "stop": ("dfl_node.cli.operator:stop", "Stop the node that runs in STATE_DIR"),
    "status": ("dfl_node.cli.operator:status", "Show a node's state"),
    "partition": ("dfl_node.cli.node_cmds:partition", "Write one data shard per node plus the global test set"),
    "plot": ("dfl_node.cli.plot:plot", "Plot averaged global (left) and local (right) accuracy"),
    "sweep": ("dfl_node.cli.sweep:sweep", "Run every grid point × seed × algorithm of GRID"),
    "certs": ("dfl_node.cli.certs:certs", "Credentials of a swarm"),
    "predict": ("dfl_node.cli.predict:predict", "Ask a running node for the classes of samples"),
    "export": ("dfl_node.cli.export:export_model", "Write a node's trained model as a file"),
    "plugins": ("dfl_node.cli.plugins:plugins",
                "List the models, algorithms, datasets and tasks this installation can run"),
}


class Verbs(click.Group):
    """The verbs of :data:`VERBS`, imported on first use (each with the log options); an operator's mistake,
    from any verb, is one line ``error: …`` on stderr and exit 1 (2 for input that cannot be used: a malformed
    data file, a plugin that cannot be used, as a bad setting), without a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in VERBS:
            return None
        if name not in self.commands:
            module, attribute = VERBS[name][0].split(":")
            self.commands[name] = log_options(getattr(importlib.import_module(module), attribute))
            if not gc.isenabled():  # main()'s own process: its verb is imported, what that made stays; collect again
                gc.freeze()
                gc.enable()
        return self.commands[name]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary + ".") for name, (_, summary) in VERBS.items()])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OperatorError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except PluginError as exc:  # a model plugin's factory that fails for the data, or returns no module
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=Verbs, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dfl-node")
@log_options
def cli() -> None:
    """dfl-node: decentralized federated learning for IoT fleets, with no central server."""


def main() -> None:
    """``dfl-node``: a process that runs one verb. The garbage collector is off while the verb is imported (torch's
    ~1M objects, for most verbs; none of them garbage, yet the collector would walk the growing heap again and
    again), then what the import made is frozen (``Verbs.get_command``), so no later full collection walks it
    either; once the verb is over, everything is, so the exit skips the interpreter's last collection, which would
    free nothing the exit does not. A daemon's start and stop took ~0.7 s of CPU less on a 2-core machine."""
    gc.disable()
    try:
        cli()
    finally:
        gc.freeze()
