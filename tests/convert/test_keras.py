"""Keras 3 (torch backend) <-> attnkit: same weights, same numbers, exact round trips."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported anywhere

import numpy as np
import pytest
import torch

keras = pytest.importorskip("keras")

from attnkit import MultiHeadAttention, masks, record_attention  # noqa: E402
from attnkit.convert import from_keras, to_keras  # noqa: E402
from attnkit.convert import keras as ck  # noqa: E402
from attnkit.modules import (  # noqa: E402
    AdditiveAttention,
    LuongAttention,
    RotaryEmbedding,
)

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="these tests feed torch tensors to Keras"
)


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def randomize(layer, seed=0):
    """Keras zero-initialises biases and sets scalars to 1: make every weight count."""
    rng = np.random.default_rng(seed)
    for v in layer.weights:
        v.assign((rng.standard_normal(v.shape) * 0.4).astype(v.dtype))
    return layer


def keras_mha(c, h, d, cc=None, seed=0, **kwargs):
    layer = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d, **kwargs)
    layer.build((None, None, c), (None, None, cc or c))
    return randomize(layer, seed)


def run(layer, *args, **kwargs):
    with torch.no_grad():
        out = layer(*args, **kwargs)
    return tuple(o.detach() for o in out) if isinstance(out, tuple) else out.detach()


def attend_mask(b, n, s, seed=1):
    m = rand(b, n, s, seed=seed) > -0.6  # Keras convention: 1 = attend
    m[..., 0] = True  # no fully masked rows here (see test_fully_masked_rows)
    return m.int()


def assert_close(got, want, atol=1e-5):
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


# --------------------------------------------------------------------------- MultiHeadAttention


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")  # Keras, N = 1
@pytest.mark.parametrize(("c", "h", "d", "n"), [(24, 3, 8, 7), (36, 4, 7, 11), (24, 2, 5, 1)])
def test_self_attention_matches_keras_with_mask_and_scores(c, h, d, n):
    theirs = keras_mha(c, h, d)
    ours = from_keras(theirs).eval()
    x = rand(2, n, c)
    am = attend_mask(2, n, n)
    want, want_w = run(theirs, x, x, attention_mask=am, return_attention_scores=True)
    fast = run(theirs, x, x, attention_mask=am)  # Keras's fused path
    with record_attention(ours) as rec:
        got = ours(x, mask=masks.from_keras_attention_mask(am))
    assert_close(got, want)
    assert_close(got, fast)
    assert_close(rec["attend"], want_w)  # (B, H, N, S) both


def test_causal_self_attention_matches_keras():
    theirs = keras_mha(24, 3, 8, seed=2)
    ours = from_keras(theirs).eval()
    x = rand(3, 7, 24)
    want = run(theirs, x, x, use_causal_mask=True)
    assert_close(ours(x, causal=True).detach(), want)


@pytest.mark.parametrize("use_bias", [True, False])
def test_cross_attention_other_widths_and_output_shape(use_bias):
    theirs = keras_mha(24, 3, 6, cc=36, output_shape=20, use_bias=use_bias, seed=3)
    ours = from_keras(theirs).eval()
    assert ours.out_dim == 20 and ours.in_proj.context_dim == 36
    x, ctx = rand(2, 7, 24), rand(2, 11, 36, seed=4)
    am = attend_mask(2, 7, 11, seed=5)
    want, want_w = run(theirs, x, ctx, attention_mask=am, return_attention_scores=True)
    with record_attention(ours) as rec:
        got = ours(x, ctx, mask=masks.from_keras_attention_mask(am))
    assert_close(got.detach(), want)
    assert_close(rec["attend"], want_w)
    # Keras's causal mask is top-left aligned; attnkit's `causal` bottom-right
    want_c = run(theirs, x, ctx, use_causal_mask=True)
    assert_close(ours(x, ctx, mask=ck.keras_causal(7, 11)).detach(), want_c)


def test_fully_masked_rows():
    """attnkit: attention output 0. Keras: 0 when it computes scores, mean of values on its
    fused path (the mask is a large negative number, so the dead row is uniform)."""
    theirs = keras_mha(24, 3, 8, seed=6)
    ours = from_keras(theirs).eval()
    x = rand(2, 5, 24)
    am = attend_mask(2, 5, 5)
    am[1, 2] = 0  # query 2 of sample 1 may attend to nothing
    with_scores, w = run(theirs, x, x, attention_mask=am, return_attention_scores=True)
    fused = run(theirs, x, x, attention_mask=am)
    got = ours(x, mask=masks.from_keras_attention_mask(am)).detach()
    assert torch.isfinite(got).all()
    bias = ours.proj.bias.detach()
    assert_close(got[1, 2], bias)  # proj(0)
    assert_close(with_scores[1, 2], bias)
    assert w[1, :, 2].abs().max() == 0
    # Keras's fused path: the mean of every value, projected
    _, _, v = ours.heads_qkv(x)
    uniform = ours.proj(ours.merge_heads(v.mean(2, keepdim=True)))[1, 0].detach()
    assert_close(fused[1, 2], uniform)
    assert_close(got[[0]], with_scores[[0]])


def test_round_trips_are_bit_identical():
    theirs = keras_mha(24, 3, 7, cc=36, output_shape=20, seed=7)
    back = to_keras(from_keras(theirs))
    for a, b in zip(theirs.weights, back.weights, strict=True):
        assert a.path.split("/", 1)[1] == b.path.split("/", 1)[1]
        assert np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    for kwargs in (dict(), dict(context_dim=36), dict(head_dim=7, out_dim=20)):
        ours = MultiHeadAttention(24, 3, **kwargs)
        again = from_keras(to_keras(ours))
        for (k1, p1), (k2, p2) in zip(
            ours.state_dict().items(), again.state_dict().items(), strict=True
        ):
            assert k1 == k2 and torch.equal(p1, p2)


def test_to_keras_output_matches():
    ours = MultiHeadAttention(36, 4, head_dim=7).eval()
    theirs = to_keras(ours)
    x = rand(2, 11, 36)
    assert_close(run(theirs, x, x), ours(x).detach())


@pytest.mark.parametrize(("ck", "cv", "dv"), [(12, 10, 6), (24, 24, 3), (9, 9, 11)])
def test_value_dim_and_key_value_widths_of_their_own(ck, cv, dv):
    """Keras's value_dim is attnkit's v_head_dim; key and value inputs of their own widths."""
    layer = keras.layers.MultiHeadAttention(num_heads=3, key_dim=5, value_dim=dv)
    layer.build((None, None, 24), (None, None, cv), (None, None, ck))  # query, value, key
    theirs = randomize(layer, seed=8)
    ours = from_keras(theirs).eval()
    assert (ours.key_dim, ours.value_dim, ours.v_head_dim) == (ck, cv, dv)
    x, key, value = rand(2, 7, 24), rand(2, 6, ck, seed=1), rand(2, 6, cv, seed=2)
    am = attend_mask(2, 7, 6, seed=3)
    want, want_w = run(theirs, x, value, key, attention_mask=am, return_attention_scores=True)
    with record_attention(ours) as rec:
        got = ours(x, key, value, mask=masks.from_keras_attention_mask(am))
    assert_close(got.detach(), want)
    assert_close(rec["attend"], want_w)
    back = to_keras(ours)
    for a, b in zip(theirs.weights, back.weights, strict=True):
        assert a.path.split("/", 1)[1] == b.path.split("/", 1)[1]
        assert np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_refusals_name_the_problem():
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match="not built"):
        from_keras(layer)
    with pytest.raises(ValueError, match="no output projection"):
        to_keras(MultiHeadAttention(16, 4, out_proj=False))
    with pytest.raises(ValueError, match="use_gate"):
        from_keras(keras_mha(8, 2, 4, use_gate=True))
    with pytest.raises(ValueError, match="GQA"):
        to_keras(MultiHeadAttention(16, 4, num_kv_heads=2))
    with pytest.raises(ValueError, match="rotary positions"):  # it would be dropped silently
        to_keras(MultiHeadAttention(16, 4, rotary=RotaryEmbedding(4)))
    with pytest.raises(ValueError, match=r"expected keras\.layers\.MultiHeadAttention"):
        from_keras(keras.layers.Dense(3))


def test_state_dict_that_does_not_fit():
    theirs = keras_mha(24, 3, 8)
    state = ck.mha_keras_state(theirs)
    state["key/kernel"] = state["key/kernel"][:20]
    del state["value/bias"]
    with pytest.raises(ValueError) as err:
        ck.load_keras_mha_state(MultiHeadAttention(24, 3), state)
    msg = str(err.value)
    assert "'key/kernel' has shape (20, 3, 8), wanted (24, 3, 8)" in msg
    assert "missing 'value/bias' (wanted (3, 8))" in msg


# --------------------------------------------------------------------------- additive / dot


def keras_masks(b, n, s, seed=9):
    qm = rand(b, n, seed=seed) > -0.8
    vm = rand(b, s, seed=seed + 1) > -0.5
    vm[:, 0] = True  # Keras makes a fully masked value row uniform; attnkit 0
    return qm, vm


def call_keras(layer, q, v, k=None, qm=None, vm=None, causal=False):
    inputs = [q, v] if k is None else [q, v, k]
    mask = None if qm is None else [qm, vm]
    return run(layer, inputs, mask=mask, return_attention_scores=True, use_causal_mask=causal)


@pytest.mark.parametrize(
    ("make", "convert"),
    [
        (lambda: keras.layers.AdditiveAttention(use_scale=True), ck.additive_from_keras),
        (lambda: keras.layers.AdditiveAttention(use_scale=False), ck.additive_from_keras),
        (
            lambda: keras.layers.Attention(score_mode="concat", use_scale=True),
            ck.additive_from_keras,
        ),
        (lambda: keras.layers.Attention(score_mode="concat"), ck.additive_from_keras),
        (lambda: keras.layers.Attention(use_scale=True), ck.luong_from_keras),
        (lambda: keras.layers.Attention(), ck.luong_from_keras),
    ],
    ids=["additive-scale", "additive", "concat-scale", "concat", "dot-scale", "dot"],
)
@pytest.mark.parametrize("key", [False, True])
def test_keras_scoring_layers_match(make, convert, key):
    layer = make()
    layer.build([(None, None, 24), (None, None, 24)])
    randomize(layer, seed=10)
    ours = convert(layer).eval()
    q, v = rand(3, 7, 24), rand(3, 11, 24, seed=1)
    k = rand(3, 11, 24, seed=2) if key else None
    qm, vm = keras_masks(3, 7, 11)
    want, want_w = call_keras(layer, q, v, k, qm, vm)
    with record_attention(ours) as rec:
        got = ours(q, v, k, mask=ck.keras_masks(qm, vm))
    assert_close(got.detach(), want)
    # attnkit's weights are 0 on masked query rows; Keras leaves them
    assert_close(rec["attend"][:, 0] * qm[..., None], want_w * qm[..., None])
    # no masks, and Keras's causal mask
    assert_close(ours(q, v, k).detach(), call_keras(layer, q, v, k)[0])
    want_c, _ = call_keras(layer, q, q, None, qm, qm | True, causal=True)
    got_c = ours(q, q, mask=ck.keras_masks(qm, qm | True, use_causal_mask=True)).detach()
    assert_close(got_c, want_c)


def test_keras_scoring_round_trips_are_bit_identical():
    for make, there, back in (
        (lambda: keras.layers.AdditiveAttention(), ck.additive_from_keras, ck.additive_to_keras),
        (
            lambda: keras.layers.Attention(score_mode="concat", use_scale=True),
            ck.additive_from_keras,
            ck.additive_to_keras,
        ),
        (lambda: keras.layers.Attention(use_scale=True), ck.luong_from_keras, ck.luong_to_keras),
    ):
        layer = make()
        layer.build([(None, None, 12), (None, None, 12)])
        randomize(layer, seed=11)
        again = back(there(layer))
        assert type(again) is type(layer)
        for a, b in zip(layer.weights, again.weights, strict=True):
            assert np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    for ours, there, back in (
        (AdditiveAttention(12), ck.additive_to_keras, ck.additive_from_keras),
        (LuongAttention(), ck.luong_to_keras, ck.luong_from_keras),
    ):
        with torch.no_grad():
            for p in ours.parameters():
                p.copy_(rand(*p.shape, seed=12))
        if isinstance(ours, AdditiveAttention):
            with torch.no_grad():
                ours.inner_scale.fill_(1.0)
        again = back(there(ours))
        for (k1, p1), (k2, p2) in zip(
            ours.state_dict().items(), again.state_dict().items(), strict=True
        ):
            assert k1 == k2 and torch.equal(p1, p2)


def test_scoring_refusals():
    with pytest.raises(ValueError, match="no projections"):
        ck.additive_to_keras(AdditiveAttention(8, hidden=4))
    with pytest.raises(ValueError, match="general"):
        ck.luong_to_keras(LuongAttention(8))
    layer = keras.layers.Attention()
    layer.build([(None, None, 4), (None, None, 4)])
    with pytest.raises(ValueError, match="luong_from_keras"):
        ck.additive_from_keras(layer)


@pytest.mark.parametrize("use_scale", [False, True])
def test_keras_concat_attention_round_trip_is_a_concat_attention(use_scale):
    layer = keras.layers.Attention(score_mode="concat", use_scale=use_scale)
    layer.build([(None, None, 12), (None, None, 12)])
    randomize(layer, seed=3)
    if use_scale:
        layer.scale.assign(1.0)  # Keras's initial value: the case that came back additive
    again = ck.additive_to_keras(ck.additive_from_keras(layer))
    assert type(again) is keras.layers.Attention
    assert again.score_mode == "concat" and again.use_scale is use_scale
    for a, b in zip(layer.weights, again.weights, strict=True):
        assert np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_keras_additive_kind_can_be_chosen_and_refused():
    layer = keras.layers.Attention(score_mode="concat", use_scale=True)
    layer.build([(None, None, 6), (None, None, 6)])
    layer.scale.assign(2.0)
    ours = ck.additive_from_keras(layer)
    with pytest.raises(ValueError, match="inner_scale != 1"):
        ck.additive_to_keras(ours, layer="additive")
    with pytest.raises(ValueError, match="layer must be"):
        ck.additive_to_keras(ours, layer="dot")


@pytest.mark.parametrize(
    ("make", "named", "cls"),
    [
        (lambda: keras.layers.AdditiveAttention(), ck.additive_from_keras, AdditiveAttention),
        (
            lambda: keras.layers.Attention(score_mode="concat"),
            ck.additive_from_keras,
            AdditiveAttention,
        ),
        (lambda: keras.layers.Attention(use_scale=True), ck.luong_from_keras, LuongAttention),
    ],
    ids=["additive", "concat", "dot"],
)
def test_from_keras_picks_the_scoring_converter(make, named, cls):
    layer = make()
    layer.build([(None, None, 12), (None, None, 12)])
    randomize(layer, seed=13)
    ours, want = from_keras(layer), named(layer)
    assert type(ours) is cls
    assert ours.state_dict().keys() == want.state_dict().keys()
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in want.state_dict().items())
    back = to_keras(ours)
    assert type(back) is type(layer)


def test_to_keras_refuses_other_modules():
    with pytest.raises(ValueError, match=r"to_keras: expected one of .*MultiHeadAttention.*"):
        to_keras(torch.nn.Linear(2, 2))
