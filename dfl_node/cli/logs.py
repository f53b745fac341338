"""How every verb logs: ``--log-level`` / ``DFL_LOG_LEVEL``, ``--log-format`` / ``DFL_LOG_FORMAT`` and
``--log-libraries``, on the group and on each verb alike (the verb's, when given, wins), so that
``dfl-node start --log-level DEBUG``, ``dfl-node --log-level DEBUG start`` and a unit file's or a compose
file's ``DFL_LOG_LEVEL=DEBUG`` all mean the same.

The level is our loggers' (``dfl_node.*``). The libraries' own (gRPC, zeroconf, uvicorn, httpx) stay at
INFO or above unless ``--log-libraries`` lets the level reach them too: DEBUG of the whole process was 91
of 109 lines of gRPC internals. Timestamps carry the date (a daemon runs for days); ``json`` writes one
object a line for a log shipper.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import click

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S%z"
QUIET_LIBRARIES = {"httpx": logging.WARNING}  # one line per status poll is noise at INFO

F = TypeVar("F", bound=Callable[..., Any])


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record, DATE_FORMAT), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def setup_logging(level: str = "INFO", fmt: str = "text", libraries: bool = False) -> None:
    """Log to stderr at ``level`` for ``dfl_node``; the libraries at ``level`` too only with ``libraries``
    (else at INFO or above). Safe to call again: the last call decides."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT, DATE_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "dfl_node", False)]:
        root.removeHandler(old)
    handler.dfl_node = True  # type: ignore[attr-defined]  # ours: replaced, never doubled, by a later call
    root.addHandler(handler)
    root.setLevel(numeric if libraries else max(numeric, logging.INFO))
    logging.getLogger("dfl_node").setLevel(numeric)
    for name, floor in QUIET_LIBRARIES.items():
        logging.getLogger(name).setLevel(numeric if libraries else max(numeric, floor))


def _apply(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Each option's callback: note the value if one was given (flag, or environment), then set logging up from
    what is known so far — the group's options are parsed before the verb's, so a verb's own value wins."""
    given = ctx.meta.setdefault("dfl_log", {})  # shared by the group's context and its verb's
    if value not in (None, False):
        given[param.name] = value
    setup_logging(given.get("log_level", "INFO"), given.get("log_format", "text"), given.get("log_libraries", False))
    return value


def quieter_by_default(level: str) -> None:
    """For a verb whose INFO is too much — ``simulate`` runs K nodes in one process, each saying what a daemon
    says — log at ``level`` unless a level was given (flag or ``DFL_LOG_LEVEL``)."""
    given = click.get_current_context().meta.setdefault("dfl_log", {})
    if "log_level" not in given:
        setup_logging(level, given.get("log_format", "text"), given.get("log_libraries", False))


def log_options(command: F) -> F:
    """``--log-level``, ``--log-format`` and ``--log-libraries`` (each also from ``DFL_LOG_*``), applied as
    soon as they are parsed; not passed to the command. (No click defaults: a verb's unset option must not
    undo what the group's said; the defaults are :func:`setup_logging`'s.)"""
    for option in reversed([
        click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=None,
                     show_default="INFO", envvar="DFL_LOG_LEVEL", show_envvar=True, expose_value=False,
                     callback=_apply, help="What dfl_node logs."),
        click.option("--log-format", type=click.Choice(FORMATS), default=None, show_default="text",
                     envvar="DFL_LOG_FORMAT", show_envvar=True, expose_value=False, callback=_apply,
                     help="text, or one JSON object a line."),
        click.option("--log-libraries", is_flag=True, default=None, envvar="DFL_LOG_LIBRARIES", show_envvar=True,
                     expose_value=False, callback=_apply,
                     help="Let --log-level reach the libraries' loggers too (gRPC, zeroconf, uvicorn)."),
    ]):
        command = option(command)
    return command
