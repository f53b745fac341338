"""Every setting of the package, by the part of the program that reads it, and how settings are read.

* :mod:`.node`: a node's (``dfl-node start``), nested by part — its data, network, membership, schedule, roles,
  evaluation, REST API and storage, plus how it learns and its algorithm's own settings;
* :mod:`.experiment`: an experiment's (``simulate``, ``testbed``, ``partition``, ``sweep``), with the simulator's
  devices, links and faults (:mod:`.simulation`);
* how a node learns (:class:`~dfl_node.learning.algorithm_settings.SharedSettings`), each algorithm's own settings
  (:class:`~dfl_node.learning.algorithm_settings.AlgorithmOptions`) and how an experiment's data is split
  (:class:`~dfl_node.learning.shard_settings.ShardSettings`) live in the learning layer, below the algorithms that
  read them; :mod:`.node` and :mod:`.experiment` hold them as parts;
* :mod:`.parts`: how settings nested by part are named flat (flags, ``DFL_*`` variables and config keys);
* :mod:`.loading`: the precedence of flags, variables, files and defaults, and the one-line errors;
* :mod:`.names`: settings that name an algorithm or a wire format.

Reading settings imports neither torch nor the node.
"""
