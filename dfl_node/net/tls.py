"""Mutual TLS between the nodes of a swarm: its files, checked once at start, and who is on the other end.

A node serves and dials with mutual TLS when it is given the swarm CA certificate, its own
certificate and its key (``--tls-dir``, or ``--tls-ca``/``--tls-cert``/``--tls-key``). Both ends
present a certificate the swarm CA signed, or the TLS handshake fails. **A node's id is its
certificate**: the subject CN *and* a DNS name of it are the node id (``dfl-node certs issue`` writes
both). The answering side reads the caller's CN from the connection and refuses a Hello (or a
Transfer, Pull, Probe) that claims another id; the dialing side verifies the answering certificate
against the id it expects (gRPC's ``ssl_target_name_override``), or, before it knows one, against the
host name it dialed (then confirms the id the answer claims; :mod:`dfl_node.node.membership.handshake`).

:func:`load_tls` checks everything a handshake would trip over, so a misconfigured node refuses to
start with one line instead of running insecure or failing every peer at run time.

cryptography is imported by the functions that read certificates, so a node without TLS never loads it
(8 MB of its memory).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from cryptography import x509


class TlsError(ValueError):
    """The TLS files cannot be used (one line for the operator)."""


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def tls_files(tls_dir: Path | None, ca: Path | None, cert: Path | None, key: Path | None) -> TlsFiles | None:
    """The three files a configuration names (each given file wins over ``tls_dir``'s), None without TLS;
    :class:`TlsError` when TLS is asked for but a file is named nowhere."""
    if tls_dir is None and ca is None and cert is None and key is None:
        return None
    from dfl_node.net.certs import CA_CERT, NODE_CERT, NODE_KEY  # certs issues them, with cryptography

    chosen = {"--tls-ca": ca or (tls_dir / CA_CERT if tls_dir else None),
              "--tls-cert": cert or (tls_dir / NODE_CERT if tls_dir else None),
              "--tls-key": key or (tls_dir / NODE_KEY if tls_dir else None)}
    ca, cert, key = chosen.values()
    if ca is None or cert is None or key is None:
        missing = [flag for flag, path in chosen.items() if path is None]
        raise TlsError(f"TLS is configured but {' and '.join(missing)} is not: mutual TLS needs the swarm CA, this "
                       "node's certificate and its key (or --tls-dir with ca.crt, node.crt and node.key)")
    return TlsFiles(ca, cert, key)


@dataclass(frozen=True)
class TlsMaterial:
    """A node's checked TLS credentials (PEM bytes)."""

    ca: bytes
    cert: bytes
    key: bytes
    node_id: str
    not_after: dt.datetime

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def _read(flag: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TlsError(f"{flag} {path} does not exist (issue one with `dfl-node certs issue`)") from None
    except OSError as exc:
        raise TlsError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def _certificate(flag: str, path: Path, data: bytes) -> x509.Certificate:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise TlsError(f"{flag} {path} is not a PEM certificate") from None


def common_name(cert: x509.Certificate) -> str:
    from cryptography.x509.oid import NameOID

    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else ""
    return value if isinstance(value, str) else value.decode(errors="replace")


def dns_names(cert: x509.Certificate) -> list[str]:
    from cryptography import x509

    try:
        return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        return []


def load_tls(files: TlsFiles, node_id: str, now: dt.datetime | None = None) -> TlsMaterial:
    """Read and check the files: the CA is a CA, the certificate is signed by it, valid now, for
    ``node_id`` (CN and DNS name) and for both TLS roles, and the key is its key."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = now or dt.datetime.now(dt.UTC)
    ca_pem, cert_pem = _read("--tls-ca", files.ca), _read("--tls-cert", files.cert)
    key_pem = _read("--tls-key", files.key)
    ca, cert = _certificate("--tls-ca", files.ca, ca_pem), _certificate("--tls-cert", files.cert, cert_pem)
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise TlsError(f"--tls-ca {files.ca} is not a CA certificate (make the swarm CA with `dfl-node certs init`)")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise TlsError(f"--tls-key {files.key} is encrypted; a node needs its key unencrypted "
                       "(keep the file 0600)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsError(f"--tls-key {files.key} is not a PEM private key") from None
    if key.public_key() != cert.public_key():
        raise TlsError(f"--tls-key {files.key} is not the key of --tls-cert {files.cert}")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise TlsError(f"--tls-cert {files.cert} is not signed by the swarm CA --tls-ca {files.ca}") from None
    if now < cert.not_valid_before_utc:
        raise TlsError(f"--tls-cert {files.cert} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC "
                       "(is this machine's clock right?)")
    if now > cert.not_valid_after_utc:
        raise TlsError(f"--tls-cert {files.cert} expired on {cert.not_valid_after_utc:%Y-%m-%d}; issue a new one")
    if now > ca.not_valid_after_utc:
        raise TlsError(f"--tls-ca {files.ca} expired on {ca.not_valid_after_utc:%Y-%m-%d}")
    cn = common_name(cert)
    if cn != node_id or node_id not in dns_names(cert):
        raise TlsError(f"--tls-cert {files.cert} is for node {cn!r}, not --id {node_id!r} (a node certificate names "
                       "its node id as CN and DNS name: `dfl-node certs issue NODE-ID`)")
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = None
    if usages is not None and not {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages):
        raise TlsError(f"--tls-cert {files.cert} is not for both TLS server and client use (a node is both)")
    return TlsMaterial(ca_pem, cert_pem, key_pem, node_id, cert.not_valid_after_utc)


def caller_id(context: grpc.aio.ServicerContext) -> str | None:
    """The node id (certificate CN) of the caller of an RPC on a mutual-TLS server; None on a plain one."""
    names = context.auth_context().get("x509_common_name")
    return names[0].decode(errors="replace") if names else None


def handshake_failure(exc: grpc.aio.AioRpcError) -> str | None:
    """What a failed call says about TLS: the peer's certificate failed our checks (or theirs ours)."""
    details = exc.details() or ""
    for marker in ("Hostname Verification Check failed", "Tls handshake failed", "Ssl handshake failed",
                   "CERTIFICATE_VERIFY_FAILED"):
        if marker in details:
            return details[details.find(marker):][:200]
    return None
