"""What more than one test file uses, in one place: test files import from here, never from each other (and never
from ``conftest.py``, which holds only fixtures and the suite's hooks). No module here is collected as tests.

- :mod:`~tests.helpers.fleet`: the shared fleet (``FLEET``), a node of it, its run simulated and as real daemons.
- :mod:`~tests.helpers.nodes`: one node in this process or as ``dfl-node start``, its orders, Hellos, REST token.
- :mod:`~tests.helpers.hostile`: a real node for hostile input, and what it must still do after an attack.
- :mod:`~tests.helpers.waiting`: waiting for a condition, on the event loop's clock or the wall clock.
- :mod:`~tests.helpers.cli`: the CLI run in-process and what the tests read off its output.
- :mod:`~tests.helpers.rest`: a fake daemon as the REST app sees it.
- :mod:`~tests.helpers.metric_names`: the metric names a node exposes, the contract of deploy/'s monitoring.
- :mod:`~tests.helpers.contexts`: a tiny node's learning context, for algorithm tests without a fleet.
- :mod:`~tests.helpers.data_files`: a user's data as CSV files.
- :mod:`~tests.helpers.codec`, :mod:`~tests.helpers.deploy`, :mod:`~tests.helpers.discovery`,
  :mod:`~tests.helpers.plugins`: transfers, deployment homes, announcements and a plugin package, as built by the
  tests of each.
"""
