"""003 App. A.3.3: the sub-model index sets of eqs. 7–9 and eq. 6's averaging, on small hand-made layers."""

from __future__ import annotations

import torch

from dfl_node.learning.models import ModelSpec, scaled
from dfl_node.learning.partial import (
    aggregate_partial,
    dropout_indices,
    extract,
    fedrolex_indices,
    heterofl_indices,
    hidden_widths,
    sub_size,
    tensor_indices,
    tensor_layers,
)


def test_index_sets_of_eqs_7_to_9() -> None:
    assert sub_size(8, 0.5) == 4 and sub_size(7, 3 / 7) == 3 and sub_size(256, 2 ** -4) == 16
    assert heterofl_indices(8, 4).tolist() == [0, 1, 2, 3]  # eq. 8
    assert fedrolex_indices(8, 4, 2).tolist() == [2, 3, 4, 5]  # eq. 9, t̃ + r·J ≤ J
    assert fedrolex_indices(8, 4, 6).tolist() == [6, 7, 0, 1]  # wraps round
    assert fedrolex_indices(8, 4, 13).tolist() == [5, 6, 7, 0]  # t̃ = 13 mod 8
    assert fedrolex_indices(8, 8, 3).tolist() == [3, 4, 5, 6, 7, 0, 1, 2]
    drawn = dropout_indices(8, 4, torch.Generator().manual_seed(1))  # eq. 7
    assert len(set(drawn.tolist())) == 4 and drawn.tolist() == sorted(drawn.tolist())
    assert 0 <= min(drawn) < max(drawn) < 8
    assert drawn.tolist() == dropout_indices(8, 4, torch.Generator().manual_seed(1)).tolist()
    assert dropout_indices(8, 8, torch.Generator().manual_seed(2)).tolist() == list(range(8))


def test_scaled_family_of_003_h1() -> None:
    assert [str(scaled(ModelSpec("cnn-ln", (128, 256)), 2.0 ** -i)) for i in range(5)] == [
        "cnn-ln:128,256", "cnn-ln:64,128", "cnn-ln:32,64", "cnn-ln:16,32", "cnn-ln:8,16"]


def _mlp(hidden: int, values: float) -> torch.nn.Module:
    model = ModelSpec("mlp", (hidden,)).build((1, 1, 2), 2)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) + values * (i + 1))
    return model


def test_eq6_averages_each_element_over_the_models_that_hold_it() -> None:
    big, small = _mlp(4, 100.0), _mlp(2, 0.0)  # mlp 2 → 4 → 2 and its rate-½ sub-model 2 → 2 → 2
    assert hidden_widths(big) == [4] and hidden_widths(small) == [2]
    shapes = {k: tuple(v.shape) for k, v in big.state_dict().items()}
    index_big = tensor_indices(tensor_layers(big), [heterofl_indices(4, 4)], shapes)
    index_small = tensor_indices(tensor_layers(small), [fedrolex_indices(4, 2, 3)], shapes)  # units 3, 0
    assert [i.tolist() for i in index_small["1.weight"]] == [[3, 0], [0, 1]]  # hidden units × all inputs
    assert [i.tolist() for i in index_small["3.weight"]] == [[0, 1], [3, 0]]  # all classes × hidden units
    merged = aggregate_partial(shapes, [big.state_dict(), small.state_dict()], [index_big, index_small])
    b, s = big.state_dict(), small.state_dict()
    # first layer's bias: units 1, 2 only in the big model; unit 3 = mean(big[3], small[0]),
    # unit 0 = mean(big[0], small[1])
    assert merged["1.bias"].tolist() == [(b["1.bias"][0] + s["1.bias"][1]).item() / 2, b["1.bias"][1].item(),
                                         b["1.bias"][2].item(), (b["1.bias"][3] + s["1.bias"][0]).item() / 2]
    assert torch.equal(merged["3.bias"], (b["3.bias"] + s["3.bias"]) / 2)  # the classifier's bias: everybody's
    assert torch.equal(merged["3.weight"][:, [1, 2]], b["3.weight"][:, [1, 2]])
    assert torch.equal(merged["3.weight"][:, 3], (b["3.weight"][:, 3] + s["3.weight"][:, 0]) / 2)
    back = extract(merged, index_small)  # the sub-model takes its units back
    assert torch.equal(back["1.weight"], merged["1.weight"][[3, 0]]) and back["3.weight"].shape == (2, 2)


def test_a_classifier_after_convolutions_slices_whole_channels_of_features() -> None:
    model = ModelSpec("cnn-ln", (2,)).build((1, 4, 4), 3)  # conv 1→2, pool to 2×2, LayerNorm, linear 8 → 3
    big = ModelSpec("cnn-ln", (4,)).build((1, 4, 4), 3)
    shapes = {k: tuple(v.shape) for k, v in big.state_dict().items()}
    layers = tensor_layers(model)
    assert layers["0.weight"] == (0, None, 1) and layers["3.weight"] == (0, None, 1)
    assert layers["5.weight"] == (None, 0, 4)
    index = tensor_indices(layers, [fedrolex_indices(4, 2, 3)], shapes)
    assert index["5.weight"][1].tolist() == [12, 13, 14, 15, 0, 1, 2, 3]  # channel 3's 2×2 features, then channel 0's
    assert [i.tolist() for i in index["3.weight"]] == [[3, 0], [0, 1]]  # LayerNorm [C, H, W]: channels sliced
    sub = extract(big.state_dict(), index)
    assert {k: tuple(v.shape) for k, v in sub.items()} == {k: tuple(v.shape) for k, v in model.state_dict().items()}
