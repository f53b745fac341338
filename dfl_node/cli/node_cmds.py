"""`dfl-node start | stop | partition | status`: the verbs of a device and of its operator.

`start`'s flags are generated from :class:`~dfl_node.node.config.NodeConfig` and `partition`'s from
:class:`~dfl_node.config.ExperimentConfig` (:mod:`dfl_node.cli.options`), so a flag, its ``DFL_*``
variable and its config-file key can never drift apart.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from dfl_node.api.status_cli import show_status
from dfl_node.cli.options import experiment_config, experiment_options, load_settings, model_options
from dfl_node.config import OperatorError
from dfl_node.learning.fleet import provision, write_fleet
from dfl_node.node.config import NodeConfig


@click.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML or TOML node config (env DFL_* and flags override it).")
@model_options(NodeConfig)
def start(config_path: Path | None, **flags: Any) -> None:
    """Run this device's node: serve gRPC + REST, discover peers, learn with them until stopped."""
    from dfl_node.node.service import serve  # grpc/zeroconf/uvicorn only for this verb

    config = load_settings(NodeConfig, config_path, flags)
    try:
        config.advertised_host  # noqa: B018 - validates --host/--advertise early
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        asyncio.run(serve(config))
    except OSError as exc:  # the node's own files: shards, test set, checkpoint folder
        raise OperatorError(str(exc)) from exc


@click.command()
@experiment_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for <node-id>/{train,val}.safetensors and test.safetensors.")
def partition(out: Path, config_path: Path | None, **flags: Any) -> None:
    """Write one data shard per node plus the global test set (what a node's --data/--test-data read)."""
    config = experiment_config(config_path, {}, **flags)
    folders = write_fleet(provision(config), out)
    click.echo(f"wrote {len(folders)} shards ({config.dataset}, {config.partition}) and test set to {out}")


@click.command()
@click.argument("url", default="http://127.0.0.1:8080")
@click.option("--all", "all_peers", is_flag=True, help="Also query every peer the node knows; exit 1 if one of them "
                                                               "does not answer.")
@click.option("--wide", is_flag=True, help="--all: every column (the default set fits 80 columns).")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Show it again every SECONDS until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(url: str, all_peers: bool, wide: bool, watch: float | None, as_json: bool) -> None:
    """Show a node's state (and with --all, its peers') from its REST API. Exit 1 if the node (or, with --all,
    any peer) cannot be queried."""
    sys.exit(show_status(url, all_peers=all_peers, as_json=as_json, wide=wide, watch=watch))


@click.command()
@click.argument("state_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("dfl-state"))
@click.option("--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for each node to save its state and exit.")
def stop(state_dir: Path, timeout: float) -> None:
    """Stop the node that runs in STATE_DIR (its --state-dir), or every node running in a folder of STATE_DIR
    (default: ./dfl-state, where nodes started without --state-dir keep theirs): SIGTERM, then wait until each
    has saved its state and released its folder. Exit 1 if none runs there, or one is still up after --timeout."""
    from dfl_node.node.persistence import StateLock  # the node's files, not the node: no network stack here

    folders = [state_dir, *(sorted(p for p in state_dir.iterdir() if p.is_dir()) if state_dir.is_dir() else [])]
    running = {folder: pid for folder in folders if (pid := StateLock.holder(folder)) is not None}
    if not running:
        raise OperatorError(f"no node runs in {state_dir}")
    for pid in running.values():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for folder, pid in running.items():
        while StateLock.holder(folder) == pid:
            if time.monotonic() > deadline:
                raise OperatorError(f"the node in {folder} (pid {pid}) is still running after {timeout:g} s")
            time.sleep(0.05)
        click.echo(f"stopped the node in {folder} (pid {pid})")
