"""`dfl-node certs init | issue | swarm-key | http-token`: a swarm's credentials (mutual TLS, or a pre-shared key),
and a REST API's bearer token.

    dfl-node certs init --out swarm-ca                       # the CA: ca.crt (share), ca.key (keep offline)
    dfl-node certs issue node-0 --ca swarm-ca --out tls/node-0 --dns node-0.lan --ip 192.168.1.50
    dfl-node start --id node-0 --tls-dir tls/node-0 …        # ca.crt, node.crt, node.key
    dfl-node certs swarm-key swarm.key                       # or: a pre-shared key, --swarm-key-file swarm.key
    dfl-node certs http-token http.token                     # REST beyond loopback: --http-token-file http.token
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
from pydantic import TypeAdapter, ValidationError

from dfl_node.errors import OperatorError
from dfl_node.net.certs import CertError, init_ca, issue_node, new_secret
from dfl_node.settings.node import NodeConfig

DIR = click.Path(file_okay=False, path_type=Path)


@click.group()
def certs() -> None:
    """Credentials of a swarm: its CA and node certificates (mutual TLS), or a pre-shared swarm key."""


@certs.command("init")
@click.option("--out", type=DIR, default=Path("swarm-ca"), show_default=True, help="Folder for ca.crt and ca.key.")
@click.option("--name", default="dfl-node swarm CA", show_default=True, help="Subject CN of the CA certificate.")
@click.option("--days", type=click.IntRange(1), default=3650, show_default=True, help="Validity of the CA.")
@click.option("--force", is_flag=True,
              help="Replace an existing CA (every node certificate must then be issued again).")
def init(out: Path, name: str, days: int, force: bool) -> None:
    """Create the swarm CA: ca.crt goes to every node, ca.key stays with whoever issues certificates."""
    try:
        issued = init_ca(out, name=name, days=days, force=force)
    except CertError as exc:
        raise OperatorError(str(exc)) from None
    click.echo(f"wrote {issued.cert} and {issued.key} (0600: keep it off the nodes)")


@certs.command("issue")
@click.argument("node_id")
@click.option("--ca", "ca_dir", type=DIR, default=Path("swarm-ca"), show_default=True,
              help="Folder of the swarm CA (`dfl-node certs init`).")
@click.option("--out", type=DIR, default=None, help="Folder for node.crt, node.key and ca.crt  [default: tls/NODE_ID]")
@click.option("--dns", multiple=True,
              help="A DNS name peers dial this node by (repeatable); the node id is always one.")
@click.option("--ip", multiple=True, help="An IP address peers dial this node by (repeatable).")
@click.option("--days", type=click.IntRange(1), default=730, show_default=True, help="Validity (at most the CA's).")
@click.option("--force", is_flag=True, help="Replace an existing certificate and key.")
def issue(node_id: str, ca_dir: Path, out: Path | None, dns: tuple[str, ...], ip: tuple[str, ...], days: int,
          force: bool) -> None:
    """Issue NODE_ID's certificate and key, signed by the swarm CA: the folder its --tls-dir reads."""
    try:
        TypeAdapter(Annotated[str, NodeConfig.model_fields["id"]]).validate_python(node_id)  # --id's own rules
    except ValidationError as exc:
        raise click.BadParameter(f"{node_id!r} is not a node id: {exc.errors()[0]['msg']}",
                                 param_hint="NODE_ID") from None
    out = out or Path("tls") / node_id
    try:
        issued = issue_node(ca_dir, node_id, out, dns=dns, ips=ip, days=days, force=force)
    except CertError as exc:
        raise OperatorError(str(exc)) from None
    names = ", ".join([node_id, *dns, *ip])
    click.echo(f"wrote {issued.cert} ({names}), {issued.key} (0600) and {out / 'ca.crt'}: start the node with "
               f"--id {node_id} --tls-dir {out}")


@certs.command("swarm-key")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace an existing key file.")
def swarm_key(file: Path, force: bool) -> None:
    """Write a new pre-shared swarm key (32 random bytes, hex, 0600) to FILE: every node's --swarm-key-file (mutual
    TLS with a CA derived from it; rolling to a new key: docs/security.md)."""
    _write_secret(file, force, "every node of the swarm")


@certs.command("http-token")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace an existing token file.")
def http_token(file: Path, force: bool) -> None:
    """Write a new REST API bearer token (32 random bytes, hex, 0600) to FILE: a node's --http-token-file, and what
    `dfl-node status --http-token-file`, Prometheus and the dashboard send."""
    _write_secret(file, force, "the nodes and whoever queries their REST API")


def _write_secret(file: Path, force: bool, who: str) -> None:
    try:
        new_secret(file, force=force)
    except CertError as exc:
        raise OperatorError(str(exc)) from None
    click.echo(f"wrote {file} (0600): copy it to {who} over a channel you trust")
