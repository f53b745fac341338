"""One node as the tests run it: its config (:func:`quiet_node_config`), in this process (:func:`running`) or as
a real ``dfl-node start`` (:func:`start_cli`, :func:`start_env`), the order a holder gives it, a Hello in another
node's name, and the REST token an operator makes for it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.net.convert import to_wire
from dfl_node.net.proto import dfl_pb2 as pb
from dfl_node.node.exchange.assignments import Assignment
from dfl_node.node.node import Node
from dfl_node.peering.messages import Assignment as WireAssignment
from dfl_node.service.run import run_node
from dfl_node.service.wiring import Daemon
from dfl_node.settings.node import NodeConfig
from dfl_node.testbed.launcher import free_port, node_env
from tests.helpers.fleet import fleet_node_config

QUIET_SWARM = f"startup-{uuid.uuid4().hex[:6]}"
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* (DEBUG|INFO|WARNING|ERROR|CRITICAL) +\S+: ")
EXIT_TIMEOUT = 40.0  # a node that should have refused to start is still running after this: it started


def quiet_node_config(shards: Path, state: Path, **changes: object) -> NodeConfig:
    """A quiet node of the test fleet: no mDNS, no REST, no evaluation unless a test asks for them."""
    settings = dict(id="node-0", data=shards / "node-0", grpc_port=free_port(), http_port=0, mdns=False,
                    swarm=QUIET_SWARM, state_dir=state, evaluate=False, heartbeat=0.2, token_timeout=0.5)
    return fleet_node_config(**{**settings, **changes})


@contextlib.asynccontextmanager
async def running(config: NodeConfig) -> AsyncIterator[Node]:
    """A node in this process, ready (or its start-up error raised), stopped on the way out."""
    daemon, stop = Daemon.build(config), asyncio.Event()
    node = daemon.node
    task = asyncio.create_task(run_node(daemon, stop))
    ready = asyncio.create_task(node.ready.wait())
    try:
        await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        yield node
    finally:
        ready.cancel()
        stop.set()
        await task


def start_env(config: NodeConfig) -> dict[str, str]:
    """The environment of ``dfl-node start`` that runs ``config``: this one's, less its DFL_* variables, plus the
    config's as DFL_* variables."""
    learning = {*SharedSettings.model_fields, *AlgorithmOptions.model_fields}
    node_settings = {k: v for k, v in config.flat(exclude_none=True).items() if k not in learning}
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
    return env | node_env(config.learning, config.per_algorithm, **node_settings)


async def start_cli(config: NodeConfig, **changes: str) -> tuple[int, list[str], str]:
    """``dfl-node start`` with the config as DFL_* variables (``changes``: variables set afterwards, for a
    setting no NodeConfig may hold): its exit status, the stderr lines that are not log records, and all of stderr."""
    env = start_env(config) | changes
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "dfl_node", "start", env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), EXIT_TIMEOUT)
    except TimeoutError:
        pytest.fail(f"dfl-node start still runs after {EXIT_TIMEOUT} s: it started despite the mistake")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    return proc.returncode, [line for line in text.splitlines() if not LOG_RECORD.match(line)], text


def order(**assignment: Any) -> Assignment:
    """The order an Assign of these fields gives a node (one it can play)."""
    given = Assignment.of(WireAssignment(**assignment))
    assert given is not None, assignment
    return given


def hello_from(node: Node, **changes: object) -> pb.HelloRequest:
    """A compatible Hello in another node's name (what a stranger that copied our settings would send)."""
    return to_wire(dataclasses.replace(node.hello(), **changes))


def new_token(path: Path) -> Path:
    """The token as an operator makes it: ``dfl-node certs http-token``."""
    subprocess.run([sys.executable, "-m", "dfl_node", "certs", "http-token", str(path)], check=True,
                   capture_output=True, timeout=60)
    assert path.stat().st_mode & 0o077 == 0 and len(path.read_text().strip()) == 64
    return path
