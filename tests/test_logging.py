"""Logging an operator can set: ``--log-level`` on the group and on every verb, ``DFL_LOG_LEVEL`` for unit and
compose files, invalid levels refused, DEBUG for our loggers only unless ``--log-libraries``, dated timestamps,
and ``--log-format json``."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from dfl_node.cli import VERBS as VERB_TABLE
from dfl_node.cli.logs import setup_logging
from dfl_node.node.core.clock import Clock
from dfl_node.node.membership.peers import PeerTable
from dfl_node.peering.messages import HelloReply
from tests.helpers.cli import invoke, verb_command

VERBS = sorted(VERB_TABLE)


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_takes_the_log_options(verb: str) -> None:
    help_text = invoke(verb, "--help").output
    for option in ("--log-level", "--log-format", "--log-libraries", "DFL_LOG_LEVEL"):
        assert option in help_text, (verb, option)


@pytest.mark.parametrize("args", [("status", "--log-level", "LOUD"), ("--log-level", "LOUD", "status")])
def test_an_invalid_level_is_refused(args: tuple[str, ...], clean_env: None) -> None:
    result = invoke(*args)
    assert result.exit_code == 2 and "Invalid value for '--log-level'" in result.output


def test_the_environment_sets_the_level_and_an_invalid_one_is_refused(clean_env: None) -> None:
    result = invoke("status", "--help", env={"DFL_LOG_LEVEL": "LOUD"})
    assert result.exit_code == 2 and "'LOUD' is not one of" in result.output
    invoke("plot", "--help", env={"DFL_LOG_LEVEL": "ERROR"})  # --help: the options were parsed and applied
    assert logging.getLogger("dfl_node").level == logging.ERROR


def test_a_verbs_level_wins_over_the_groups(clean_env: None) -> None:
    nobody = "http://127.0.0.1:9"  # refused at once: status exits 1, after its options were applied
    invoke("--log-level", "ERROR", "status", "--log-level", "DEBUG", nobody)
    assert logging.getLogger("dfl_node").level == logging.DEBUG
    invoke("--log-level", "ERROR", "status", nobody)
    assert logging.getLogger("dfl_node").level == logging.ERROR


def test_debug_is_ours_unless_the_libraries_are_asked_for() -> None:
    setup_logging("DEBUG")
    assert logging.getLogger("dfl_node.node.node").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    setup_logging("DEBUG", libraries=True)
    assert logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.DEBUG)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_line_is_dated_text_or_one_json_object(fmt: str) -> None:
    code = ("import logging; from dfl_node.cli.logs import setup_logging; "
            f"setup_logging('INFO', '{fmt}'); logging.getLogger('dfl_node.x').info('hello %s', 'there')")
    line = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr.strip()
    if fmt == "json":
        record = json.loads(line)
        assert record["level"] == "INFO" and record["logger"] == "dfl_node.x" and record["message"] == "hello there"
        stamp = record["time"]
    else:
        stamp, rest = line.split(" ", 1)
        assert rest.split() == ["INFO", "dfl_node.x:", "hello", "there"]
    assert stamp[:4].isdigit() and stamp[4] == "-" and "T" in stamp  # the date, not only the time of day


def test_help_status_and_stop_import_neither_torch_nor_the_node(tmp_path: Path) -> None:
    """`dfl-node --help` and `status` once imported torch (1.6-2.7 s, ~256 MB for a status query)."""
    for args in (["--help"], ["status", "http://127.0.0.1:9"], ["stop", str(tmp_path)], ["status", "--help"]):
        code = ("import sys; from dfl_node.cli import cli\n"
                f"try:\n    cli({args!r})\nexcept SystemExit:\n    pass\n"
                "heavy = sorted(m for m in ('torch', 'grpc', 'numpy', 'pydantic', 'zeroconf') if m in sys.modules)\n"
                "print('imported:', heavy)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        assert out.strip().endswith("imported: []"), (args, out)


def test_each_verbs_line_in_help_opens_its_own_help() -> None:
    for name, (_, summary) in VERB_TABLE.items():
        assert (verb_command(name).help or "").startswith(summary), name


async def test_a_node_says_how_many_peers_it_has_while_it_waits(caplog: pytest.LogCaptureFixture) -> None:
    """A node waiting for ``--min-peers`` once said nothing; now it says how many it has, when that changes."""
    table = PeerTable("me", hello=None, clock=Clock(), heartbeat=1.0, timeout=3.0, static=[])  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="dfl_node.node.membership.peers"):
        waiting = asyncio.create_task(table.wait_for(2))
        for have, peer in enumerate(("a", "b")):
            while f"have {have}, need 2" not in caplog.text:  # the waiter has run up to its next wait
                await asyncio.sleep(0)
            table.seen(HelloReply(node_id=peer, grpc_address=f"127.0.0.1:{ord(peer)}", boot_id=peer))
        await asyncio.wait_for(waiting, timeout=5)
    said = [r.getMessage() for r in caplog.records if "peer" in r.getMessage()]
    assert said == ["me: waiting for peers: have 0, need 2", "peer a at 127.0.0.1:97 is alive",
                    "me: waiting for peers: have 1, need 2", "peer b at 127.0.0.1:98 is alive",
                    "me: 2 peer(s) alive; starting"]
