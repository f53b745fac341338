"""Issuing a swarm's credentials: its certificate authority, node certificates, a pre-shared key.

``dfl-node certs init`` makes the swarm CA (``ca.crt``, ``ca.key``); ``dfl-node certs issue NODE-ID``
a node's certificate and key signed by it, into the folder a node's ``--tls-dir`` reads (``ca.crt``,
``node.crt``, ``node.key``). A node certificate names its node id as its subject CN **and** as a DNS
name (the identity peers check, :mod:`dfl_node.net.tls`), plus the DNS names and IP addresses peers
dial it by. Keys are ECDSA P-256, written 0600. Nothing here touches the network.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"
NODE_CERT, NODE_KEY = "node.crt", "node.key"
SECRET_BYTES = 32


class CertError(ValueError):
    """A credential cannot be made as asked (one line for the operator)."""


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    """Write ``data`` with ``mode`` from the start (a key is never readable by others, not even briefly)."""
    if path.exists() and not force:
        raise CertError(f"{path} exists; not overwriting it (--force replaces it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def ca_certificate(key: ec.EllipticCurvePrivateKey, name: str, serial: int, not_before: dt.datetime,
                   not_after: dt.datetime, *, deterministic: bool = False) -> x509.Certificate:
    """A self-signed swarm CA certificate for ``key``. ``deterministic``: an RFC 6979 signature, so that the same key,
    name, serial and validity give the same certificate on every machine (the CA a swarm key derives)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(serial).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256(), ecdsa_deterministic=deterministic or None)
    )


def init_ca(out: Path, *, name: str = "dfl-node swarm CA", days: int = 3650, force: bool = False) -> Issued:
    """A new swarm CA in ``out``: ``ca.crt`` (share it with every node) and ``ca.key`` (keep it offline)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = ca_certificate(key, name, x509.random_serial_number(), now - dt.timedelta(minutes=5),
                          now + dt.timedelta(days=days))
    issued = Issued(out / CA_CERT, out / CA_KEY)
    for path in (issued.cert, issued.key):
        if path.exists() and not force:
            raise CertError(f"{path} exists; not overwriting the swarm CA (--force replaces it, and then every "
                            "node certificate must be issued again)")
    _write(issued.key, pem_key(key), 0o600, force)
    _write(issued.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644, force)
    return issued


def load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise CertError(f"{exc.filename} not found: make the swarm CA first with `dfl-node certs init`") from None
    except ValueError as exc:
        raise CertError(f"{ca_dir}: not a swarm CA ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise CertError(f"{key_path} is not the key of {cert_path}")
    return cert, key


def node_certificate(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, node_id: str, *,
                     dns: tuple[str, ...] = (), ips: tuple[str, ...] = (), days: int = 730,
                     validity: tuple[dt.datetime, dt.datetime] | None = None,
                     ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A fresh key and its certificate for ``node_id`` (CN and first DNS name: the identity peers check, then the
    names and addresses peers dial it by), for TLS server and client use, signed by the CA; valid from now for
    ``days`` (within the CA's validity), or over ``validity``."""
    try:
        addresses = [ipaddress.ip_address(ip) for ip in ips]
    except ValueError as exc:
        raise CertError(f"--ip: {exc}") from None
    names = list(dict.fromkeys([node_id, *dns]))  # the node id first: it is the identity peers check
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_before, not_after = validity or (now - dt.timedelta(minutes=5),
                                         min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([*map(x509.DNSName, names), *map(x509.IPAddress, addresses)]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def issue_node(ca_dir: Path, node_id: str, out: Path, *, dns: tuple[str, ...] = (), ips: tuple[str, ...] = (),
               days: int = 730, force: bool = False) -> Issued:
    """A certificate for ``node_id`` signed by the CA in ``ca_dir``, written to ``out`` with its key and
    a copy of ``ca.crt``: the folder that node's ``--tls-dir`` reads."""
    ca_cert, ca_key = load_ca(ca_dir)
    cert, key = node_certificate(ca_cert, ca_key, node_id, dns=dns, ips=ips, days=days)
    issued = Issued(out / NODE_CERT, out / NODE_KEY)
    _write(issued.key, pem_key(key), 0o600, force)
    _write(issued.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644, force)
    _write(out / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644, True)
    return issued


def new_secret(path: Path, *, force: bool = False) -> Path:
    """A fresh secret (32 random bytes, hex), written 0600: a swarm key (``--swarm-key-file``) or a REST API's
    bearer token (``--http-token-file``)."""
    _write(path, (secrets.token_hex(SECRET_BYTES) + "\n").encode(), 0o600, force)
    return path
