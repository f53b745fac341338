"""``--http-token-file`` of the verbs that query a node's REST API (``status``, ``predict``): the fleet's bearer
token, read once, sent with every request. Light, as those verbs are: no torch, no node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from dfl_node.errors import OperatorError
from dfl_node.secret_file import SecretFileError, read_secret

F = TypeVar("F", bound=Callable[..., object])


def http_token_option(command: F) -> F:
    """The option, also read from ``DFL_HTTP_TOKEN_FILE`` (the variable a node reads its own from)."""
    return click.option("--http-token-file", type=click.Path(dir_okay=False, path_type=Path),
                        envvar="DFL_HTTP_TOKEN_FILE", default=None,
                        help="The REST token of the nodes queried (their --http-token-file), sent with every "
                             "request.")(command)


def http_headers(token_file: Path | None) -> dict[str, str]:
    """The headers that carry the token in ``token_file`` (none without one); an unusable file is the one-line
    :class:`OperatorError`."""
    if token_file is None:
        return {}
    try:
        token = read_secret(token_file, "REST token", "http-token")
    except SecretFileError as exc:
        raise OperatorError(str(exc)) from None
    return {"Authorization": "Bearer " + token.decode("latin-1")}
