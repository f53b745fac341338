"""`dfl-node plot` of async runs: drawn against the seconds since they started (or the fleet's fusions
where a result has no times), never against "rounds" they did not have; round and async runs each in their own
row of panels; legend labels that name the mode and leave out settings a run's mode ignored (the testbed's
default rounds=20 of a run that ran for --duration). The figures are inspected as objects, on Agg."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import pytest
from click.testing import CliRunner

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.figure import Figure  # noqa: E402

from dfl_node.cli import cli  # noqa: E402
from dfl_node.cli.plot import run_labels  # noqa: E402
from dfl_node.results import EvalRecord, NodeResult, RunResult, SeriesRecord, write_results  # noqa: E402

TIMES = (8.0, 14.5, 21.0)  # seconds since the run started, at its three evaluations (5, 10, 15 rounds or fusions)


def result(mode: str = "async", driver: str = "testbed", times: Sequence[float] = TIMES, algorithm: str = "defkt",
           models: Sequence[str] = ("mlp",), series: bool = False, **config: Any) -> RunResult:
    """A run as its driver writes it: an async run's records count fusions in ``round``, and its config keeps
    the testbed's default rounds=20 although --duration ended it."""
    ids = [f"n{i}" for i in range(len(models))]
    accs = [0.5, 0.7, 0.8]
    history = [EvalRecord(round=5 * (k + 1), global_accuracy=acc, local_accuracy=acc, per_node_global=dict.fromkeys(
                   ids, acc), per_node_local=dict.fromkeys(ids, acc), bytes_transmitted=0, wall_time_s=time,
                   series={"regular": SeriesRecord(global_accuracy=acc - 0.1, local_accuracy=acc - 0.1,
                                                   per_node_global={}, per_node_local={})} if series else {})
               for k, (time, acc) in enumerate(zip(times, accs))]
    nodes = [NodeResult(id=i, global_accuracy=0.8, local_accuracy=0.8, param_sha256="0", num_train=10, model=m)
             for i, m in zip(ids, models)]
    return RunResult(driver=driver, algorithm=algorithm, mode=mode,
                     config={"name": "x", "dataset": "digits", "rounds": 20, "seed": 0, **config},
                     rounds=history[-1].round, history=history, nodes=nodes, bytes_transmitted=0,
                     models_transmitted=0, wall_time_s=times[-1] + 1.0)


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Figure]]:
    """The figures `dfl-node plot` saves, by file name (nothing is written)."""
    figures: dict[str, Figure] = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **_: figures.__setitem__(Path(path).name, fig))
    yield figures
    for fig in figures.values():
        plt.close(fig)


def plot(tmp_path: Path, runs: list[RunResult], *options: str) -> None:
    paths = [str(write_results(run, tmp_path / f"run{i}")[0]) for i, run in enumerate(runs)]
    shown = CliRunner().invoke(cli, ["plot", *paths, "-o", str(tmp_path / "fig.png"), *options],
                               catch_exceptions=False)
    assert shown.exit_code == 0, shown.output


def legend(ax: Any) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_an_async_run_is_drawn_against_the_seconds_since_it_started(tmp_path: Path, saved: dict) -> None:
    plot(tmp_path, [result(series=True)])
    ax_global, ax_local = saved["fig.png"].axes
    assert [ax.get_xlabel() for ax in (ax_global, ax_local)] == ["seconds since the run started"] * 2
    solid, dashed = ax_global.lines  # the run and its other reported model ("regular"), on the same time axis
    assert list(solid.get_xdata()) == list(TIMES) and list(dashed.get_xdata()) == list(TIMES)
    assert dashed.get_linestyle() == "--" and legend(ax_global) == ["defkt", "defkt: regular"]


def test_virtual_seconds_and_fusions_where_a_result_has_no_times(tmp_path: Path, saved: dict) -> None:
    plot(tmp_path, [result(driver="simulate", seed=1), result(driver="simulate", times=(0.0, 0.0, 0.0), seed=2)])
    axes = saved["fig.png"].axes
    assert [ax.get_xlabel() for ax in axes] == ["seconds since the run started (simulate: virtual seconds)"] * 2 + [
        "fusions (completed exchanges, summed over the fleet)"] * 2
    assert list(axes[0].lines[0].get_xdata()) == list(TIMES) and list(axes[2].lines[0].get_xdata()) == [5, 10, 15]
    assert legend(axes[0]) == ["defkt seed=1"] and legend(axes[2]) == ["defkt seed=2"]


def test_round_and_async_runs_get_a_row_each_labelled_by_mode(tmp_path: Path, saved: dict) -> None:
    plot(tmp_path, [result(mode="async"), result(mode="round", rounds=50)])  # the async one: default rounds=20
    top_global, top_local, bottom_global, bottom_local = saved["fig.png"].axes
    assert top_global.get_xlabel() == top_local.get_xlabel() == "round"
    assert bottom_global.get_xlabel() == bottom_local.get_xlabel() == "seconds since the run started"
    assert top_global.get_title() == "averaged global accuracy, round mode"
    assert bottom_local.get_title() == "averaged local accuracy, async mode"
    assert legend(top_global) == ["defkt (round)"] and legend(bottom_global) == ["defkt (async)"]
    assert list(top_global.lines[0].get_xdata()) == [5, 10, 15]


def test_labels_leave_out_what_an_async_run_ignored_and_name_what_differs() -> None:
    assert run_labels([result(seed=0), result(seed=1, rounds=50)]) == ["defkt seed=0", "defkt seed=1"]
    assert run_labels([result(), result(rounds=50)]) == ["defkt #1", "defkt #2"]  # only --duration told them apart
    assert run_labels([result(mode="round"), result(mode="round", rounds=50)]) == ["defkt rounds=20",
                                                                                 "defkt rounds=50"]
    assert run_labels([result(driver="simulate"), result(mode="round", rounds=50)]) == [
        "defkt (simulate, async)", "defkt (testbed, round)"]


def test_cluster_bars_are_named_as_the_curves(tmp_path: Path, saved: dict) -> None:
    mixed = ("mlp:16", "mlp:32")  # two architectures: dfl-node plot adds the per-cluster figure (003 Fig. 5)
    plot(tmp_path, [result(algorithm="dfml", models=mixed, seed=0), result(algorithm="dfml", models=mixed, seed=1)])
    assert legend(saved["fig.png"].axes[0]) == ["dfml seed=0", "dfml seed=1"]
    assert legend(saved["fig-clusters.png"].axes[0]) == ["dfml seed=0", "dfml seed=1"]


def test_help_says_how_round_and_async_runs_are_drawn() -> None:
    shown = CliRunner().invoke(cli, ["plot", "--help"], terminal_width=200)
    assert shown.exit_code == 0
    text = " ".join(shown.output.split())
    assert "drawn against seconds since the run started" in text and "one row of panels per x-axis" in text
    assert "leaving out those a run's mode ignores" in text
