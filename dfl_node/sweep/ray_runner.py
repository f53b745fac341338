"""Running a sweep's runs on Ray: one remote task per run, ``num_cpus=1``; Ray schedules them.

``auto`` joins the cluster this machine belongs to (``ray start``), an address joins that cluster,
``local`` starts a private Ray instance on this machine (on 127.0.0.1, no dashboard, no usage
statistics: nothing leaves the machine). An already initialised Ray (``ray.init`` by the caller) is
used as it is. Every node of a cluster needs dfl-node installed and the datasets at ``data_dir``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence

from dfl_node.errors import OperatorError
from dfl_node.sweep.execute import Outcome, attempt
from dfl_node.sweep.grid import RunTask

RAY_MISSING = "--ray needs Ray, which is not installed: pip install -e '.[ray]'"


# A private instance: loopback only (Ray's "no cluster" mode, which skips its probe for the LAN
# address; read when ray is first imported), no usage statistics sent anywhere, and 120 s rather than
# Ray's 30 for its GCS server to start: on a busy 2-core device it took longer, and the sweep failed.
_LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
              "RAY_gcs_server_port_wait_time_s": "120"}


def require_ray() -> None:
    """Fail in one line, before anything runs, where Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        raise OperatorError(RAY_MISSING)


def init_ray(address: str, num_cpus: int | None = None) -> bool:
    """Connect to (or start) Ray unless it already is; True if this call did it (and should shut it down)."""
    require_ray()
    if address == "local":
        for key, value in _LOCAL_ENV.items():
            os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return False
    if address == "local":
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 configure_logging=False, log_to_driver=False)
    else:
        ray.init(address=address, configure_logging=False)
    return True


def run_ray(tasks: Sequence[RunTask], address: str, on_outcome: Callable[[Outcome], None],
            num_cpus: int | None = None) -> None:
    """Run ``tasks`` as Ray tasks, calling ``on_outcome`` here as each ends; Ctrl-C cancels the rest."""
    started = init_ray(address, num_cpus)
    import ray

    remote = ray.remote(num_cpus=1)(attempt)
    pending = {remote.remote(task): task for task in tasks}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # the worker died (out of memory, node lost): this run failed
                    outcome = Outcome(task, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
                on_outcome(outcome)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()
