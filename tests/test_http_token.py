"""The REST API's bearer token: with ``--http-token-file`` every route but ``/healthz`` answers 401
without it (and with a wrong one), the verbs that query a node send it, and a node serving REST beyond loopback
without one starts only with ``--insecure``.

The node is real and runs in this process, its REST API on a real loopback port (the token's check does not
depend on the address: beyond loopback it is required, on loopback optional); the verbs run as the user runs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest

from dfl_node.errors import OperatorError
from dfl_node.service.wiring import Daemon
from dfl_node.testbed.launcher import free_port
from tests.helpers.nodes import new_token, quiet_node_config, running, start_cli


async def cli(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFL_")}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "dfl_node", *args, env=env,
                                                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_every_route_but_healthz_needs_the_token(fleet_shards: Path, tmp_path: Path) -> None:
    token_file = new_token(tmp_path / "http.token")
    token = token_file.read_text().strip()
    config = quiet_node_config(fleet_shards, tmp_path / "state", http_port=free_port(), http_token_file=token_file)
    async with running(config) as node:
        base = f"http://127.0.0.1:{node.config.api.http_port}"
        wrong = token[:-1] + ("1" if token.endswith("0") else "0")  # one character off (a token ends in 0 1 in 16)
        good, bad = {"Authorization": f"Bearer {token}"}, {"Authorization": f"Bearer {wrong}"}
        async with httpx.AsyncClient(base_url=base, timeout=30, trust_env=False) as client:
            schema = (await client.get("/openapi.json", headers=good)).json()
            routes = [(method.upper(), path) for path, methods in schema["paths"].items() for method in methods]
            routes += [("GET", "/"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/no-such-route")]
            assert {("GET", "/status"), ("GET", "/metrics"), ("GET", "/model"), ("POST", "/predict")} <= set(routes)
            for method, path in routes:
                url = path.replace("{", "").replace("}", "")
                for headers in ({}, bad, {"Authorization": token}, {"Authorization": "Basic " + token}):
                    reply = await client.request(method, url, headers=headers)
                    expected = 200 if path == "/healthz" else 401
                    assert reply.status_code == expected, (method, path, headers, reply.text[:200])
                    if expected == 401:
                        assert reply.headers["www-authenticate"].startswith("Bearer"), (method, path)
                        assert token not in reply.text
                reply = await client.request(method, url, headers=good, **({"json": {"samples": []}}
                                                                             if method == "POST" else {}))
                assert reply.status_code != 401, (method, path)
            # the dashboard comes with its 401: a browser shows the page, which asks for the token
            page = await client.get("/")
            assert page.status_code == 401 and 'id="login"' in page.text
            assert (await client.get("/status", headers=good)).json()["id"] == "node-0"


async def test_status_and_predict_send_the_token(fleet_shards: Path, tmp_path: Path) -> None:
    token_file = new_token(tmp_path / "http.token")
    config = quiet_node_config(fleet_shards, tmp_path / "state", http_port=free_port(), http_token_file=token_file)
    (tmp_path / "one.json").write_text(json.dumps({"samples": [[0.0] * 64]}))
    async with running(config) as node:
        url = f"http://127.0.0.1:{node.config.api.http_port}"
        code, out, err = await cli("status", url, "--json", "--http-token-file", str(token_file))
        assert code == 0 and '"id": "node-0"' in out, err
        code, out, err = await cli("status", url)
        assert code == 1 and " ".join(err.split()) == (f"error: refused by {url}: /status needs the node's REST "
                                                       "token: give --http-token-file (or DFL_HTTP_TOKEN_FILE)"), err
        code, out, err = await cli("predict", str(tmp_path / "one.json"), "--url", url, "--http-token-file",
                                   str(token_file))
        assert code == 0 and len(out.splitlines()) == 1, err
        code, out, err = await cli("predict", str(tmp_path / "one.json"), "--url", url)
        assert code == 1 and "answered HTTP 401" in err and "--http-token-file" in err, err
        missing = tmp_path / "missing"
        code, out, err = await cli("status", url, "--http-token-file", str(missing))
        assert (code, " ".join(err.split())) == (1, f"error: REST token file {missing} does not exist (make one with "
                                                    f"`dfl-node certs http-token {missing}`)"), err


def test_rest_beyond_loopback_needs_a_token_or_insecure(fleet_shards: Path, tmp_path: Path) -> None:
    open_rest = dict(http_port=free_port(), http_host="0.0.0.0")
    with pytest.raises(ValueError, match=r"the REST API on 0\.0\.0\.0 is reachable from the network without a "
                                          r"token.*--http-token-file"):
        quiet_node_config(fleet_shards, tmp_path / "state", **open_rest)
    assert quiet_node_config(fleet_shards, tmp_path / "state", **open_rest, insecure=True).api.open_to_network
    config = quiet_node_config(fleet_shards, tmp_path / "state", **open_rest, http_token_file=tmp_path / "http.token")
    assert not config.api.open_to_network
    with pytest.raises(OperatorError, match=r"^REST token file .*http\.token does not exist"):
        Daemon.build(config)  # read at start: a node never serves without the token it was told to require
    (tmp_path / "http.token").write_text("short\n")
    with pytest.raises(OperatorError, match=r"holds 5 bytes; a REST token needs at least 32"):
        Daemon.build(config)


async def test_start_refuses_open_rest_with_one_line(fleet_shards: Path, tmp_path: Path) -> None:
    config = quiet_node_config(fleet_shards, tmp_path / "state", http_port=free_port(), insecure=True,
                               http_host="0.0.0.0")
    status, lines, text = await start_cli(config, DFL_INSECURE="false")  # the operator did not say it
    assert status == 2 and "serving" not in text
    assert [line for line in lines if line.lower().startswith("error")] == [
        "Error: the REST API on 0.0.0.0 is reachable from the network without a token, so anyone there could take "
        "this node's model and spend its CPU on predictions; give --http-token-file (`dfl-node certs http-token "
        "FILE`), or --insecure (DFL_INSECURE=1) on a private network"]
    assert not (tmp_path / "state").exists()  # refused as a setting: nothing locked, bound or written
