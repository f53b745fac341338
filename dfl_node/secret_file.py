"""A secret kept in a file of its own (a swarm key, a REST token): read once at start, with one line for the
operator when it is missing, unreadable or too short to be secret. A leaf: the node, the REST API's client and the
gRPC side all read their secrets through it."""

from __future__ import annotations

from pathlib import Path

MIN_SECRET_BYTES = 32  # `dfl-node certs swarm-key | http-token` write 64 hex characters


class SecretFileError(ValueError):
    """The secret's file cannot be used (one line for the operator)."""


def read_secret(path: Path, what: str, command: str) -> bytes:
    """``what``'s bytes in ``path`` without surrounding whitespace, at least :data:`MIN_SECRET_BYTES` of them;
    ``command`` is the ``dfl-node certs`` verb that makes one."""
    try:
        secret = path.read_bytes().strip()
    except FileNotFoundError:
        raise SecretFileError(f"{what} file {path} does not exist (make one with `dfl-node certs {command} {path}`)"
                              ) from None
    except OSError as exc:
        raise SecretFileError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretFileError(f"{what} file {path} holds {len(secret)} bytes; a {what} needs at least "
                              f"{MIN_SECRET_BYTES} (make one with `dfl-node certs {command} FILE`)")
    return secret
