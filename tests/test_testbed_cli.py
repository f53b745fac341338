"""`dfl-node testbed` as a user runs it: the real verb in a subprocess, its daemons, its work folder.

These tests hold the verb to what it promises on the command line: an async run stops on its own
and reports the exchanges the fleet really made; a failed run ends in a short error and keeps its
work folder for the post-mortem; SIGTERM tears the fleet down like Ctrl-C does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dfl_node.testbed.launcher import all_done, done_twice
from tests.helpers.cli import summary_rounds
from tests.helpers.waiting import wait_for

NODES = 3
# the tiny digits preset, one algorithm, 3 daemons with 1 torch thread each: seconds, not minutes
BASE_ARGS = ["--nodes", str(NODES), "--algorithm", "defkt", "--no-mdns", "--static-peers"]


def proc_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None if there is no such process): a PID plus it names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return None if fields[0] == "Z" else fields[19]  # state, …, starttime (field 22 of proc(5))


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (the testbed's daemons), read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


class CliRuns:
    """Starts `dfl-node testbed` subprocesses and, whatever happens, kills them and every daemon seen."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path / "tmp"  # TMPDIR of the verb: its dfl-testbed-* folders land here and nowhere else
        self.tmp.mkdir()
        self.processes: list[subprocess.Popen] = []
        self.daemons: dict[int, str] = {}  # pid -> start time

    def start(self, *args: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
        env.update(TMPDIR=str(self.tmp), COLUMNS="200", PYTHONUNBUFFERED="1", DFL_THREADS="1")
        process = subprocess.Popen([sys.executable, "-m", "dfl_node", "testbed", *BASE_ARGS, *args], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.processes.append(process)
        return process

    def remember_daemons(self, testbed: subprocess.Popen) -> list[int]:
        """The testbed's daemon PIDs, recorded so that teardown can kill them if the verb orphaned them."""
        pids = [p for p in children_of(testbed.pid) if "dfl_node" in Path(f"/proc/{p}/cmdline").read_text()]
        for pid in pids:
            if (start := proc_start_time(pid)) is not None:
                self.daemons[pid] = start
        return pids

    def alive_daemons(self) -> list[int]:
        return [pid for pid, start in self.daemons.items() if proc_start_time(pid) == start]

    def temp_folders(self) -> list[Path]:
        return sorted(self.tmp.glob("dfl-testbed-*"))

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.communicate()
        for pid in self.alive_daemons():
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def testbed(tmp_path: Path) -> Iterator[CliRuns]:
    bed = CliRuns(tmp_path)
    try:
        yield bed
    finally:
        bed.close()


def log_tails(folder: Path, lines: int = 15) -> str:
    """The end of every node log under ``folder``: what an assertion message needs to explain a failed run."""
    return "\n".join(f"--- {log.name} ---\n" + "\n".join(log.read_text().splitlines()[-lines:])
                     for log in sorted(folder.glob("**/node-*.log")))


def status(role: str, done: bool, fusions: int) -> dict:
    return {"role": role, "done": done, "fusions": fusions}


def test_fleet_is_done_only_when_two_polls_in_a_row_say_so() -> None:
    """node-0 read idle before node-1's last push reached it, node-1 read done after: one poll is not enough."""
    stale = {"node-0": status("idle", True, 3), "node-1": status("idle", True, 2)}
    fusing = {"node-0": status("receiver", False, 3), "node-1": status("idle", True, 2)}
    final = {"node-0": status("idle", True, 4), "node-1": status("idle", True, 2)}
    assert all_done(stale)  # the race a single poll falls for
    settled = done_twice()
    assert [settled(s) for s in (stale, fusing, final, final)] == [False, False, False, True]


@pytest.mark.slow
def test_async_run_stops_after_duration_and_reports_the_exchanges_it_made(testbed: CliRuns, tmp_path: Path) -> None:
    out, work = tmp_path / "result.json", tmp_path / "work"
    # --rounds is deliberately absurd: async mode must report what happened, not the config
    process = testbed.start("--mode", "async", "--duration", "5", "--rounds", "999", "--timeout", "60",
                            "--out", str(out), "--workdir", str(work))
    stdout, stderr = process.communicate(timeout=80)
    assert process.returncode == 0, f"{stdout}\n{stderr}\n{log_tails(work)}"
    reported = summary_rounds(stdout)
    result = json.loads(out.read_text())
    states = [json.loads((work / "defkt" / "state" / f"node-{i}" / "state.json").read_text()) for i in range(NODES)]
    counters = [s["counters"] for s in states]  # each node's own checkpointed counts
    fusions = sum(c["fusions"] for c in counters)
    assert reported == result["rounds"] == fusions > 0, (counters, log_tails(work))
    assert result["mode"] == "async"
    assert result["models_transmitted"] == fusions, (counters, log_tails(work))  # every model sent was fused
    assert result["history"], "an async run has an accuracy curve too"
    assert [r["round"] for r in result["history"]][-1] == fusions
    assert all(r["round"] <= fusions for r in result["history"])
    assert "completed exchanges" in stdout  # the summary says what its rounds count
    # once nobody could open a dashboard during a run; now every node's URL and the work folder are printed
    assert f"defkt: work folder {work / 'defkt'}" in stdout
    urls = re.findall(r"^  (node-\d+)  (http://\S+/)$", stdout, flags=re.M)
    assert [node for node, _ in urls] == [f"node-{i}" for i in range(NODES)], stdout


@pytest.mark.slow
def test_timeout_is_a_short_error_and_keeps_the_work_folder(testbed: CliRuns) -> None:
    process = testbed.start("--rounds", "200", "--timeout", "2")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    lines = stderr.strip().splitlines()
    assert len(lines) < 20, stderr
    assert "{'" not in stderr and '{"' not in stderr, stderr
    assert any(re.match(r"\s*node-\d+: ", line) for line in lines), stderr  # which nodes were not done
    kept = [Path(m) for m in re.findall(r"work folder kept: (\S+)", stderr)]
    assert len(kept) == 1, stderr
    assert kept[0].is_dir() and kept[0] in testbed.temp_folders()
    logs = sorted(p.name for p in kept[0].glob("defkt/node-*.log"))
    assert logs == [f"node-{i}.log" for i in range(NODES)]
    assert (kept[0] / "shards").is_dir()


@pytest.mark.slow
def test_sigterm_stops_every_daemon_and_removes_the_temp_folder(testbed: CliRuns) -> None:
    process = testbed.start("--rounds", "200", "--timeout", "120")

    def serving() -> bool:
        logs = [p for folder in testbed.temp_folders() for p in folder.glob("defkt/node-*.log")]
        return len(logs) == NODES and all("serving gRPC" in p.read_text() for p in logs)

    wait_for(lambda: serving() or process.poll() is not None, 60, "the daemons to serve")
    assert process.poll() is None, process.communicate()
    daemons = testbed.remember_daemons(process)
    assert len(daemons) == NODES
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=40)
    assert process.returncode in (1, 128 + signal.SIGTERM), f"{stdout}\n{stderr}"
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert testbed.alive_daemons() == []
    assert testbed.temp_folders() == []
