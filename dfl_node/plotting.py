"""matplotlib, imported only where a figure is drawn (``dfl-node plot``, a sweep's plots): it is the ``[plot]``
extra, which a node never needs, so without it those verbs fail in one line that names the extra."""

from __future__ import annotations

import importlib.util

from dfl_node.errors import OperatorError


def require_matplotlib(verb: str) -> None:
    """:class:`OperatorError` where matplotlib is not installed (nothing imported); ``verb``: what needs it."""
    if importlib.util.find_spec("matplotlib") is None:
        raise OperatorError(f"{verb} draws with matplotlib, which is not installed: pip install 'dfl-node[plot]'")


def use_agg(verb: str) -> None:
    """matplotlib with its file-only Agg backend (no display needed), or :func:`require_matplotlib`'s error."""
    require_matplotlib(verb)
    import matplotlib

    matplotlib.use("Agg")
