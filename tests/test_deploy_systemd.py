"""The systemd unit: hardened, reading a copy of the shared node command line plus the device's own
file, valid for ``systemd-analyze verify``; the mutual-TLS drop-in (deploy/systemd/dfl-node-tls.conf)
hands the node its certificate as systemd credentials, which the node loads with its own checks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dfl_node.net.certs import CA_CERT, NODE_CERT, NODE_KEY
from dfl_node.net.tls import load_tls
from dfl_node.settings.loading import ConfigError
from dfl_node.testbed.netns import read_env_file
from tests.helpers.deploy import DEPLOY, FIELDS, SHARED, deployed_node_config, tls_of

SYSTEMD_TLS = DEPLOY / "systemd" / "dfl-node-tls.conf"


def unit_entries(path: Path) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
    return sections


def test_systemd_unit_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    unit = DEPLOY / "systemd" / "dfl-node.service"
    service = unit_entries(unit)["Service"]
    values = dict(service)
    assert [v for k, v in service if k == "EnvironmentFile"] == ["/etc/dfl-node/node.env", "/etc/dfl-node/dfl-node.env"]
    assert values["User"] not in ("", "root") and values["ExecStart"].endswith("dfl-node start")
    assert values["Restart"] == "on-failure" and values["StateDirectory"] == "dfl-node"
    assert values["RestartPreventExitStatus"] == "2"  # unusable settings: restarting cannot fix them
    assert values["NoNewPrivileges"] == "yes" and values["ProtectSystem"] == "strict"
    assert {"AF_INET", "AF_NETLINK"} <= set(values["RestrictAddressFamilies"].split())
    device_file = DEPLOY / "systemd" / "dfl-node.env"
    device = read_env_file(device_file)
    # a device names its own address, and is no testbed: node.env's DFL_INSECURE=true does not reach it, nor its
    # REST API on every interface
    assert set(device) <= FIELDS and set(device) & set(SHARED) == {"DFL_HOST", "DFL_INSECURE", "DFL_HTTP_HOST"}
    assert SHARED["DFL_HTTP_HOST"] == "0.0.0.0" and device["DFL_HTTP_HOST"] == "127.0.0.1"
    assert SHARED["DFL_INSECURE"] == "true" and device["DFL_INSECURE"] == "false"
    with pytest.raises(ConfigError, match=r"--swarm-key-file\) is set"):  # its LAN address, no credentials
        deployed_node_config({**SHARED, **device}, monkeypatch)
    # the documented way out: the fleet's swarm key, the line to uncomment
    (key_line,) = [line[1:] for line in device_file.read_text().splitlines() if line.startswith("#DFL_SWARM_KEY_FILE=")]
    name, _, path = key_line.partition("=")
    config = deployed_node_config({**SHARED, **device, name: path}, monkeypatch)
    assert config.network.host != "0.0.0.0" and config.state_path.is_relative_to("/var/lib/dfl-node")
    assert not config.network.open_to_network and config.network.swarm_key_file.is_relative_to("/etc/dfl-node")
    # REST on its LAN address: with the token, the lines to uncomment (without it, the node refuses to start)
    rest = dict(line[1:].partition("=")[::2] for line in device_file.read_text().splitlines()
                if line.startswith(("#DFL_HTTP_HOST=", "#DFL_HTTP_TOKEN_FILE=")))
    with pytest.raises(ConfigError, match=r"REST API on 192\.168\.1\.50 .* without a token"):
        deployed_node_config({**SHARED, **device, name: path, "DFL_HTTP_HOST": rest["DFL_HTTP_HOST"]}, monkeypatch)
    config = deployed_node_config({**SHARED, **device, name: path, **rest}, monkeypatch)
    assert config.api.http_host == config.network.host and config.api.http_token_file.is_relative_to("/etc/dfl-node")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    text = (DEPLOY / "systemd" / "dfl-node.service").read_text()
    unit = tmp_path / "dfl-node.service"  # the real ExecStart only exists once installed
    unit.write_text(re.sub(r"(?m)^ExecStart=.*$", "ExecStart=/bin/true", text))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "Unknown" not in res.stderr and "ignoring" not in res.stderr, res.stderr


# ----------------------------------------------------------------------------- the mutual-TLS drop-in
def test_systemd_tls_dropin_hands_the_node_its_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (service,) = unit_entries(SYSTEMD_TLS).values()
    credentials = dict(value.split(":", 1) for key, value in service if key == "LoadCredential")
    assert set(credentials) == {CA_CERT, NODE_CERT, NODE_KEY}  # the names --tls-dir reads
    assert all(Path(source).parent == Path("/etc/dfl-node/tls") for source in credentials.values())
    environment = [value for key, value in service if key == "Environment"]
    assert [key for key, _ in service] == ["LoadCredential"] * 3 + ["Environment"]
    (assignment,) = environment
    name, _, value = assignment.partition("=")
    assert name == "DFL_TLS_DIR"
    # what systemd does at start: copy each source into /run/credentials/<unit> under its credential name
    device = read_env_file(DEPLOY / "systemd" / "dfl-node.env")
    assert not [key for key in device if key.startswith("DFL_TLS")]  # an EnvironmentFile= would override the drop-in
    etc = tmp_path / "etc"
    subprocess.run([sys.executable, "-m", "dfl_node", "certs", "init", "--out", str(tmp_path / "ca")], check=True,
                   capture_output=True, timeout=60)
    subprocess.run([sys.executable, "-m", "dfl_node", "certs", "issue", device["DFL_ID"], "--ca", str(tmp_path / "ca"),
                    "--out", str(etc), "--ip", device["DFL_HOST"]], check=True, capture_output=True, timeout=60)
    run = Path(value.replace("%n", "dfl-node.service").replace("%d", "/run/credentials/dfl-node.service"))
    assert run == Path("/run/credentials/dfl-node.service")  # systemd's credentials directory for a system service
    creds = tmp_path / "credentials"
    creds.mkdir()
    for credential, source in credentials.items():
        shutil.copy(etc / Path(source).name, creds / credential)
    config = deployed_node_config({**SHARED, **device, name: str(creds)}, monkeypatch)
    assert not config.network.insecure and not config.network.open_to_network
    assert load_tls(tls_of(config), config.id).node_id == device["DFL_ID"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_with_the_tls_dropin(tmp_path: Path) -> None:
    text = (DEPLOY / "systemd" / "dfl-node.service").read_text()
    (tmp_path / "dfl-node.service").write_text(re.sub(r"(?m)^ExecStart=.*$", "ExecStart=/bin/true", text))
    dropins = tmp_path / "dfl-node.service.d"
    dropins.mkdir()
    dropin = dropins / SYSTEMD_TLS.name

    def verify() -> subprocess.CompletedProcess:  # drop-ins are read from the unit search path only
        return subprocess.run(["systemd-analyze", "verify", "dfl-node.service"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"})

    dropin.write_text(SYSTEMD_TLS.read_text() + "LoadCredential=bad/name:/x\n")  # the control: a broken drop-in
    assert "ignoring" in verify().stderr, "systemd-analyze did not read the drop-in"
    shutil.copy(SYSTEMD_TLS, dropin)
    res = verify()
    assert res.returncode == 0 and "Unknown" not in res.stderr and "ignoring" not in res.stderr, res.stderr
