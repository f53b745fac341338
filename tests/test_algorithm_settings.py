"""Each algorithm's own settings are a model of their own (issue 19): the algorithm reads them from ``settings``,
which holds those and no others, while a fleet's :class:`LearningConfig` keeps them all, flat, for flags,
``DFL_*`` variables and config files."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dfl_node.algorithms import ALGORITHMS, make_algorithm
from dfl_node.learning.settings import LearningConfig, SharedSettings


def test_every_setting_is_shared_or_some_algorithms_own() -> None:
    shared = set(SharedSettings.model_fields)
    owned = {name for cls in ALGORITHMS.values() for name in cls.settings_model.model_fields}
    assert set(LearningConfig.model_fields) == shared | owned and not shared & owned


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_an_algorithm_sees_its_own_settings_only_with_the_values_given(name: str) -> None:
    config = LearningConfig(segments=4, dfml_epochs=3, meme_model="mlp:16", selection="random", fair_c=0.25,
                            prox_mu=0.5, senders=0.75, fedrolex_roll_largest=False)
    algorithm = make_algorithm(name, config)
    own = type(algorithm).settings_model.model_fields
    assert set(algorithm.settings.model_dump()) == set(own)
    assert all(getattr(algorithm.settings, field) == getattr(config, field) for field in own)
    others = set(LearningConfig.model_fields) - set(own) - set(SharedSettings.model_fields)
    assert not any(hasattr(algorithm.settings, field) for field in others)


def test_an_algorithms_own_rule_holds_in_the_fleets_config() -> None:
    with pytest.raises(ValidationError, match="fair_weight_min 0.9 is above fair_weight_max 0.1"):
        LearningConfig(fair_weight_min=0.9, fair_weight_max=0.1)
