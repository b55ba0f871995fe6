"""AttentionMaps: validation, selection, head means and the JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

from attnkit.viz import AttentionMaps

TOKENS = ["a", "b", "c", "d"]


def probs(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).softmax(-1)


def make(L: int = 2, H: int = 3, N: int = 4, S: int | None = None) -> AttentionMaps:
    S = N if S is None else S
    keys = None if S == N else [f"k{j}" for j in range(S)]
    return AttentionMaps([f"t{i}" for i in range(N)], probs(L, H, N, S), key_tokens=keys)


# ----------------------------------------------------------------------------- from_layers
def test_from_layers_picks_batch_index_and_stacks_layers():
    layers = [probs(2, 3, 4, 4, seed=s) for s in range(5)]  # (B, H, N, S)
    m = AttentionMaps.from_layers(TOKENS, layers, batch_index=1)
    assert m.shape == (5, 3, 4, 4)
    for l in range(5):
        torch.testing.assert_close(m.maps[l], layers[l][1])
    assert m.key_tokens == TOKENS
    assert m.names == [f"layer {i}" for i in range(5)]


def test_from_layers_accepts_3d_and_cross_attention():
    layers = [probs(2, 4, 6, seed=s) for s in range(2)]  # (H, N, S)
    keys = [f"k{j}" for j in range(6)]
    m = AttentionMaps.from_layers(TOKENS, layers, key_tokens=keys, layer_names=["x", "y"])
    assert m.shape == (2, 2, 4, 6)
    assert m.key_tokens == keys and m.layer_names == ["x", "y"]


def test_from_layers_detaches_and_converts_to_float32_cpu():
    t = probs(1, 2, 4, 4).double().requires_grad_()
    m = AttentionMaps.from_layers(TOKENS, [t])
    assert m.maps.dtype == torch.float32 and not m.maps.requires_grad


@pytest.mark.parametrize(
    ("layers", "kwargs", "match"),
    [
        ([probs(4, 4)], {}, r"layers\[0\].*\(4, 4\).*wanted"),
        ([probs(1, 1, 2, 4, 4)], {}, r"layers\[0\].*rank|layers\[0\].*wanted"),
        ([probs(1, 2, 5, 4)], {}, r"layers\[0\].*\(2, 5, 4\).*len\(tokens\)"),
        ([probs(1, 2, 4, 3)], {"key_tokens": ["x", "y"]}, r"layers\[0\].*len\(key_tokens\)"),
        ([probs(1, 2, 4, 4), probs(1, 3, 4, 4)], {}, r"layers\[1\].*3 heads.*layers\[0\] has 2"),
        ([probs(2, 2, 4, 4)], {"batch_index": 2}, r"batch_index.*2.*batch size 2"),
        ([], {}, r"layers.*empty"),
        (probs(1, 2, 4, 4), {}, r"layers.*sequence"),
        ([probs(1, 2, 4, 4)], {"layer_names": ["a", "b"]}, r"layer_names.*2 names.*L = 1"),
    ],
)
def test_from_layers_errors_name_argument_and_shapes(layers, kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionMaps.from_layers(TOKENS, layers, **kwargs)


def test_error_message_gives_got_and_wanted_shapes():
    with pytest.raises(ValueError) as e:
        AttentionMaps.from_layers(TOKENS, [probs(1, 2, 5, 4)])
    msg = str(e.value)
    assert "(2, 5, 4)" in msg and "(B, H, 4, 4)" in msg


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_errors(bad):
    t = probs(1, 2, 4, 4)
    t[0, 1, 2, 3] = bad
    with pytest.raises(ValueError, match=r"maps.*NaN or inf"):
        AttentionMaps.from_layers(TOKENS, [t])


def test_rows_not_summing_to_one_warn_but_masked_rows_do_not():
    scores = torch.randn(1, 2, 4, 4)  # not probabilities
    with pytest.warns(UserWarning, match="rows sum to neither"):
        AttentionMaps.from_layers(TOKENS, [scores])
    masked = probs(1, 2, 4, 4)
    masked[..., 3, :] = 0.0  # a fully masked query row sums to 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = AttentionMaps.from_layers(TOKENS, [masked])
    assert m.maps[0, :, 3].sum() == 0


def test_direct_construction_validates_too():
    with pytest.raises(ValueError, match=r"maps.*\(L, H, N, S\).*rank 3"):
        AttentionMaps(TOKENS, probs(2, 4, 4))
    with pytest.raises(ValueError, match=r"maps.*N = len\(tokens\) = 3"):
        AttentionMaps(TOKENS[:3], probs(1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"S = len\(tokens \(no key_tokens given\)\) = 4"):
        AttentionMaps(TOKENS, probs(1, 1, 4, 5))
    with pytest.raises(ValueError, match=r"tokens.*list of str"):
        AttentionMaps("abcd", probs(1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"tokens.*item 1 is int"):
        AttentionMaps(["a", 1, "c", "d"], probs(1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"maps.*torch.Tensor"):
        AttentionMaps(TOKENS, [[0.25] * 4] * 4)


def test_is_frozen():
    m = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.tokens = ["x"]  # type: ignore[misc]


# ----------------------------------------------------------------------------- transforms
def test_select_layers_and_heads_keeps_values_and_names():
    m = make(L=4, H=5)
    s = m.select(layers=[3, 1], heads=-1)
    assert s.shape == (2, 1, 4, 4)
    torch.testing.assert_close(s.maps[0, 0], m.maps[3, 4])
    torch.testing.assert_close(s.maps[1, 0], m.maps[1, 4])
    assert s.names == ["layer 3", "layer 1"]
    assert m.select().shape == m.shape
    assert m.select(heads=[0, 2]).maps.equal(m.maps[:, [0, 2]])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layers": 4}, r"layers: index 4 out of range for 4"),
        ({"heads": [0, 5]}, r"heads: index 5 out of range for 5"),
        ({"heads": []}, r"heads.*empty"),
        ({"layers": [0.5]}, r"layers.*int"),
    ],
)
def test_select_rejects_bad_indices(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(L=4, H=5).select(**kwargs)


def test_mean_over_heads():
    m = make(L=2, H=3)
    mean = m.mean_over_heads()
    assert mean.shape == (2, 1, 4, 4)
    torch.testing.assert_close(mean.maps[1, 0], (m.maps[1, 0] + m.maps[1, 1] + m.maps[1, 2]) / 3)
    torch.testing.assert_close(mean.maps.sum(-1), torch.ones(2, 1, 4))


# ----------------------------------------------------------------------------- JSON
def test_json_round_trip_through_text():
    m = AttentionMaps(
        ["<s>", "é", '"q"'], probs(2, 2, 3, 5), key_tokens=list("vwxyz"), layer_names=["p", "q"]
    )
    d = json.loads(json.dumps(m.to_json_dict(decimals=4)))
    assert d["shape"] == [2, 2, 3, 5] and d["decimals"] == 4
    assert d["tokens"] == ["<s>", "é", '"q"'] and d["key_tokens"] == list("vwxyz")
    back = AttentionMaps.from_json_dict(d)
    assert back.tokens == m.tokens and back.key_tokens == m.key_tokens
    assert back.layer_names == ["p", "q"]
    assert back.shape == m.shape
    assert (back.maps - m.maps).abs().max() <= 0.5e-4 + 1e-7
    assert (back.maps - m.maps).abs().max() > 0  # rounding really happened


def test_json_rounds_to_requested_decimals():
    m = AttentionMaps(["a", "b"], torch.tensor([[[[0.123456, 0.876544], [1.0, 0.0]]]]))
    d = m.to_json_dict(decimals=3)
    assert d["maps"] == [[[[0.123, 0.877], [1.0, 0.0]]]]
    with pytest.raises(ValueError, match="decimals"):
        m.to_json_dict(decimals=-1)


def test_from_json_dict_validates():
    d = make().to_json_dict()
    with pytest.raises(ValueError, match="format"):
        AttentionMaps.from_json_dict({**d, "format": "bertviz"})
    with pytest.raises(ValueError, match=r"data\['maps'\].*\(2, 3, 4, 4\).*\(2, 3, 4, 5\)"):
        AttentionMaps.from_json_dict({**d, "shape": [2, 3, 4, 5]})
    with pytest.raises(ValueError, match="missing keys"):
        AttentionMaps.from_json_dict({k: v for k, v in d.items() if k != "tokens"})
    with pytest.raises(ValueError, match="len\\(tokens\\)"):
        AttentionMaps.from_json_dict({**d, "tokens": ["x"]})
