"""`dfl-node start | partition`: the verbs of a device (``status`` and ``stop``: :mod:`dfl_node.cli.operator`).

`start`'s flags are generated from :class:`~dfl_node.settings.node.NodeConfig` and `partition`'s from
:class:`~dfl_node.settings.experiment.ExperimentConfig` (:mod:`dfl_node.cli.options`), so a flag, its ``DFL_*``
variable and its config-file key can never drift apart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from dfl_node.cli.options import experiment_config, load_settings, model_options, partition_options
from dfl_node.cli.plugins import EPILOG
from dfl_node.errors import OperatorError
from dfl_node.learning.provision import provision, write_fleet
from dfl_node.learning.shard_settings import AS_RECORDED
from dfl_node.learning.user_datasets import recorded_devices
from dfl_node.settings.node import NodeConfig


@click.command(epilog=EPILOG)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML or TOML node config (env DFL_* and flags override it).")
@model_options(NodeConfig)
def start(config_path: Path | None, **flags: Any) -> None:
    """Run this device's node: serve gRPC + REST, discover peers, learn with them until stopped."""
    from dfl_node.service.run import serve  # grpc/zeroconf/uvicorn only for this verb

    config = load_settings(NodeConfig, config_path, flags)
    try:
        config.network.advertised_host  # noqa: B018 - validates --host/--advertise early
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        asyncio.run(serve(config))
    except OSError as exc:  # the node's own files: shards, test set, checkpoint folder
        raise OperatorError(str(exc)) from exc


@click.command()
@partition_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for <node-id>/{train,val}.safetensors and test.safetensors.")
def partition(out: Path, config_path: Path | None, **flags: Any) -> None:
    """Write one data shard per node plus the global test set (what a node's --data/--test-data read)."""
    config = experiment_config(config_path, {}, **flags)
    fleet = provision(config)
    folders = write_fleet(fleet, out)
    shards = config.shards
    click.echo(f"wrote {len(folders)} shards ({shards.dataset}, {shards.partition}) and test set to {out}")
    if shards.partition == AS_RECORDED:  # which shard is which device: node i is the i-th by name
        devices = recorded_devices(Path(shards.dataset))
        click.echo("devices: " + ", ".join(f"{c.node_id} {d.name}" for c, d in zip(fleet.clients, devices)))
    if fleet.learning:  # a dataset of the user's own: the values every node started on these shards takes
        click.echo("learning settings in every shard: " + ", ".join(f"{k} {v:g}" for k, v in fleet.learning.items()))
