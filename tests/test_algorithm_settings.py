"""Each algorithm's own settings are a model of their own: the algorithm reads them from ``settings``,
which holds those and no others, while a fleet's settings keep them all in their ``per_algorithm`` part
(:class:`AlgorithmOptions`), named flat for flags, ``DFL_*`` variables and config files. The settings every
algorithm shares (:class:`SharedSettings`) are all an algorithm's ``config`` holds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dfl_node.algorithms import ALGORITHMS, make_algorithm
from dfl_node.learning.algorithm_settings import AlgorithmOptions, SharedSettings
from dfl_node.settings.experiment import ExperimentConfig
from dfl_node.settings.node import NodeConfig


def test_every_setting_of_an_algorithm_is_some_algorithms_own() -> None:
    owned = {name for cls in ALGORITHMS.values() for name in cls.settings_model.model_fields}
    assert set(AlgorithmOptions.model_fields) == owned and not owned & set(SharedSettings.model_fields)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_an_algorithm_sees_its_own_settings_only_with_the_values_given(name: str) -> None:
    options = AlgorithmOptions(segments=4, dfml_epochs=3, meme_model="mlp:16", selection="random", fair_c=0.25,
                               prox_mu=0.5, senders=0.75, fedrolex_roll_largest=False)
    algorithm = make_algorithm(name, SharedSettings(), options)
    own = type(algorithm).settings_model.model_fields
    assert set(algorithm.settings.model_dump()) == set(own)
    assert all(getattr(algorithm.settings, field) == getattr(options, field) for field in own)
    others = set(AlgorithmOptions.model_fields) - set(own)
    assert not any(hasattr(algorithm.settings, field) for field in others)
    assert isinstance(algorithm.config, SharedSettings)  # nobody else's settings through the shared ones either
    assert not any(hasattr(algorithm.config, field) for field in others)


@pytest.mark.parametrize("model", [ExperimentConfig, NodeConfig])
def test_an_algorithms_own_rule_holds_in_the_fleets_config(model: type[ExperimentConfig | NodeConfig]) -> None:
    node = {"id": "n", "data": "missing"} if model is NodeConfig else {}
    with pytest.raises(ValidationError, match="fair_weight_min 0.9 is above fair_weight_max 0.1"):
        model.model_validate({**node, "fair_weight_min": 0.9, "fair_weight_max": 0.1})
