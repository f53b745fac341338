"""`dfl-node status | stop`: the operator's verbs, light on purpose — they import neither torch nor the node, so a
status query on a small device costs what its HTTP request costs."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import click

from dfl_node.api.status_cli import DEFAULT_URL, show_status
from dfl_node.cli.http_token import http_headers, http_token_option
from dfl_node.errors import OperatorError
from dfl_node.node.model.state_lock import StateLock


@click.command()
@click.argument("url", default=DEFAULT_URL)
@click.option("--all", "all_peers", is_flag=True, help="Also query every peer the node knows; exit 1 if one of them "
                                                               "does not answer.")
@click.option("--wide", is_flag=True, help="--all: every column (the default set fits 80 columns).")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Show it again every SECONDS until Ctrl-C.")
@click.option("--wait-done", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="First wait, up to SECONDS, until the node (with --all, every node shown) answers and is done "
                   "(--rounds reached, --duration over); exit 1 if it is not by then.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@http_token_option
def status(url: str, all_peers: bool, wide: bool, watch: float | None, wait_done: float | None,
           as_json: bool, http_token_file: Path | None) -> None:
    """Show a node's state (and with --all, its peers') from its REST API. Exit 1 if the node (or, with --all,
    any peer) cannot be queried."""
    sys.exit(show_status(url, all_peers=all_peers, as_json=as_json, wide=wide, watch=watch, wait_done=wait_done,
                         headers=http_headers(http_token_file)))


@click.command()
@click.argument("state_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("dfl-state"))
@click.option("--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for each node to save its state and exit.")
def stop(state_dir: Path, timeout: float) -> None:
    """Stop the node that runs in STATE_DIR (its --state-dir), or every node running in a folder of STATE_DIR
    (default: ./dfl-state, where nodes started without --state-dir keep theirs): SIGTERM, then wait until each
    has saved its state and released its folder. Exit 1 if none runs there, or one is still up after --timeout."""
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
