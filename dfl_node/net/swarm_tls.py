"""Swarm-key mode as standard TLS: a swarm CA derived from the key, and a node certificate issued at start.

Every node of a swarm holds the same secret (``--swarm-key-file``). From it each derives, with HKDF-SHA256 under a
fixed label, the same EC P-256 private key, and over it the same self-signed CA certificate (fixed name, serial
and validity, a deterministic RFC 6979 signature): the swarm CA, the same on every node, computed and never
written. At start a node issues itself, with that CA, a certificate for a fresh key (CN and first DNS name its
node id, then the addresses it serves on, as ``dfl-node certs issue`` does), in memory only. Everything after that
is mutual TLS (:mod:`dfl_node.net.tls`): TLS 1.3, both ends' certificates checked against the swarm CA, the
peer's against its node id.

Rollover: the key file holds one key, or two lines — the current key, then the next. A node presents a certificate
of the current key's CA and trusts both CAs, so nodes holding (K1), (K1, K2), (K2, K1) and (K2) talk to their
neighbours at each step of a rollover (docs/security.md, "Rolling the swarm key").

What it does not do: every key holder can derive the CA key, so it can issue a certificate for any node id; the
key proves membership of the swarm, not which member (per-device identity is mutual TLS with files).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from functools import cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from dfl_node.net.certs import ca_certificate, node_certificate, pem_key
from dfl_node.net.tls import TlsMaterial
from dfl_node.secret_file import MIN_SECRET_BYTES, SecretFileError, read_secret

INFO = b"dfl-node swarm-key CA v1"  # the HKDF label: a new version of the derivation changes it
MAX_KEYS = 2  # the current key and the next one
# Fixed validity of the derived CA and of a node's certificates: the same CA everywhere, and no clock to trust (a
# device may boot with its clock in 1970 or drift; a node's key lives as long as its process, in its memory only).
NOT_BEFORE = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
NOT_AFTER = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)  # RFC 5280: "no well-defined expiration date"
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def read_swarm_keys(path: Path) -> tuple[bytes, ...]:
    """The keys of ``path``: the current one, then possibly the next (one a line, each at least 32 bytes)."""
    keys = tuple(line.strip() for line in read_secret(path, "swarm key", "swarm-key").splitlines() if line.strip())
    if len(keys) > MAX_KEYS:
        raise SecretFileError(f"swarm key file {path} holds {len(keys)} keys; it holds the current key and at most "
                              "the next one, one a line")
    for number, key in enumerate(keys, 1):
        if len(key) < MIN_SECRET_BYTES:
            raise SecretFileError(f"swarm key file {path}: line {number} holds {len(key)} bytes; a swarm key needs "
                                  f"at least {MIN_SECRET_BYTES} (make one with `dfl-node certs swarm-key FILE`)")
    return keys


@cache
def derived_ca(key: bytes) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The swarm CA of ``key``: the same certificate and private key on every node that holds it. Its name carries
    a fingerprint of its public key, so the CAs of two keys never share a name (a rollover trusts both)."""
    material = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=INFO).derive(key)
    # 384 bits reduced to [1, n-1]: a bias of 2^-128 at most (FIPS 186-5 A.2.1)
    private = ec.derive_private_key(int.from_bytes(material, "big") % (_P256_ORDER - 1) + 1, ec.SECP256R1())
    public = private.public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    name = f"dfl-node swarm-key CA {hashlib.sha256(public).hexdigest()[:16]}"
    return ca_certificate(private, name, 1, NOT_BEFORE, NOT_AFTER, deterministic=True), private


def certificate_hosts(*hosts: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(DNS names, IP addresses) among the hosts a node serves on and advertises; a wildcard is no address."""
    names: dict[str, None] = {}
    addresses: dict[str, None] = {}
    for host in hosts:
        if not host:
            continue
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            names[host] = None
            continue
        if not address.is_unspecified:
            addresses[str(address)] = None
    return tuple(names), tuple(addresses)


def swarm_tls(keys: tuple[bytes, ...], node_id: str, hosts: tuple[str | None, ...]) -> TlsMaterial:
    """This node's TLS credentials in swarm-key mode: a fresh certificate from the current key's CA (for
    ``node_id`` and ``hosts``), and every key's CA as the roots it trusts."""
    ca_cert, ca_key = derived_ca(keys[0])
    dns, ips = certificate_hosts(*hosts)
    cert, key = node_certificate(ca_cert, ca_key, node_id, dns=dns, ips=ips, validity=(NOT_BEFORE, NOT_AFTER))
    roots = b"".join(derived_ca(k)[0].public_bytes(serialization.Encoding.PEM) for k in keys)
    return TlsMaterial(roots, cert.public_bytes(serialization.Encoding.PEM), pem_key(key), node_id,
                       cert.not_valid_after_utc)
