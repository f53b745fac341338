"""The one error type the command line reports as a line, not a traceback; here, apart from the config models,
so that the CLI catches it without importing them (``dfl-node --help`` and ``status`` stay light)."""

from __future__ import annotations


class OperatorError(Exception):
    """A mistake of the operator's found at run time (a port in use, a state dir taken, a duplicate id, a
    dataset that is not on the machine): the CLI reports it as one line ``error: …`` and exits 1, without a
    traceback, which stays for bugs."""
