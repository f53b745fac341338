"""`dfl-node plugins`: what this installation can run — the built-in models, algorithms, datasets and tasks, and the
plugins that installed packages declare in the entry-point groups ``dfl_node.models``, ``dfl_node.algorithms``,
``dfl_node.datasets`` and ``dfl_node.tasks`` (:mod:`dfl_node.plugins`), each with its ``module:attribute`` and its
package.

Listing reads the packages' metadata and imports no plugin; ``--check`` loads each one, as a node would, and
says which fail (exit 1), so a broken install is found before a fleet is started on it.
"""

from __future__ import annotations

import json
from typing import Any

import click

from dfl_node.plugins import GROUPS, PluginError, installed, load_installed

# What `start` and `simulate` say under their options: where a model or an algorithm of one's own comes from.
EPILOG = ("Models and algorithms of your own: an installed plugin package (entry-point groups dfl_node.models, "
          "dfl_node.algorithms, dfl_node.datasets; `dfl-node plugins` lists them) named like a built-in, or "
          "--model package.module:factory. A peer's Hello never makes a node load anything: a peer whose model "
          "or algorithm is not installed here is refused (unknown_model, unknown_algorithm).")


def _builtins() -> dict[str, list[str]]:
    from dfl_node.algorithms import ALGORITHMS  # noqa: PLC0415 - torch only for this verb
    from dfl_node.learning.datasets import DATASETS  # noqa: PLC0415
    from dfl_node.learning.models import builtin_models  # noqa: PLC0415
    from dfl_node.learning.tasks import BUILTIN_TASKS  # noqa: PLC0415

    return {"models": list(builtin_models()), "algorithms": sorted(ALGORITHMS), "datasets": sorted(DATASETS),
            "tasks": sorted(BUILTIN_TASKS)}


def _problem(kind: str, name: str) -> str | None:
    """Why the installed plugin ``name`` of ``kind`` cannot be used (None: it loads, and is what its group takes)."""
    from dfl_node.algorithms import algorithm_class  # noqa: PLC0415 - torch only for --check
    from dfl_node.learning.tasks import Task  # noqa: PLC0415

    try:
        if kind == "algorithms":
            algorithm_class(name)
        elif kind == "tasks":
            found = load_installed(kind, name)
            if not (isinstance(found, type) and issubclass(found, Task)):
                return f"{installed(kind)[name].value} is not a subclass of dfl_node.learning.tasks.Task"
        elif not callable(load_installed(kind, name)):
            return f"{installed(kind)[name].value} is not callable"
    except PluginError as exc:
        return str(exc)
    return None


def _listing(check: bool) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for kind, builtin in _builtins().items():
        rows = []
        for name, entry in sorted(installed(kind).items()):
            dist = entry.dist
            row: dict[str, Any] = {"name": name, "value": entry.value, "package": dist.name if dist else None,
                                   "version": dist.version if dist else None}
            if check:
                row["problem"] = _problem(kind, name)
            rows.append(row)
        found[kind] = {"group": GROUPS[kind], "builtin": builtin, "plugins": rows}
    return found


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
@click.option("--check", is_flag=True, help="Load every installed plugin, as a node would; exit 1 if one fails.")
def plugins(as_json: bool, check: bool) -> None:
    """List the models, algorithms, datasets and tasks this installation can run: the built-ins, and the plugins
    that installed packages declare (entry-point groups dfl_node.models, dfl_node.algorithms, dfl_node.datasets,
    dfl_node.tasks).
    Use a plugin by its name (--model NAME, --algorithm NAME); a model may also be named as
    package.module:factory without any installation."""
    found = _listing(check)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    else:
        _print(found, check)
    if any(row.get("problem") for group in found.values() for row in group["plugins"]):
        raise click.exceptions.Exit(1)


def _print(found: dict[str, Any], check: bool) -> None:
    """Per kind: its entry-point group, the built-ins on one line, then a line per installed plugin."""
    for kind, group in found.items():
        click.echo(f"{kind} (entry-point group {group['group']})")
        click.echo(f"  built in: {', '.join(group['builtin'])}")
        for row in group["plugins"]:
            package = f"{row['package']} {row['version']}" if row["package"] else "an unknown package"
            verdict = "" if not check else "  ok" if row["problem"] is None else f"  FAILS: {row['problem']}"
            click.echo(f"  {row['name']}  {row['value']}  ({package}){verdict}")
        if not group["plugins"]:
            click.echo("  no plugin installed")
