"""The error types the command line reports as a line, not a traceback; here, apart from the config models,
so that the CLI catches them without importing them (``dfl-node --help`` and ``status`` stay light)."""

from __future__ import annotations


class OperatorError(Exception):
    """A mistake of the operator's found at run time (a port in use, a state dir taken, a duplicate id, a
    dataset that is not on the machine): the CLI reports it as one line ``error: …`` and exits 1, without a
    traceback, which stays for bugs."""

    exit_code = 1


class InputError(OperatorError, ValueError):
    """Input the operator handed in that cannot be used: a data file with a malformed row, a shard of the wrong
    shape. One line naming the file (and the row), exit 2 as for bad usage: nothing was started."""

    exit_code = 2
