"""attnkit.nn.MultiheadAttention against torch.nn.MultiheadAttention with the same weights.

Float64, 1e-12: batch first or not × key/value widths × bias_k/zero attention × every mask
torch takes (key padding bool/float, attn_mask 2-D/3-D bool/float, both, is_causal) ×
need_weights × average_attn_weights, in eval with dropout set; state dicts both ways; and a
Hypothesis property over every combination at once (head counts, bias, unbatched input, sizes
1 to 6, torch with and without autograd).
"""

from __future__ import annotations

import importlib
import itertools
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnkit.nn import MultiheadAttention

E, H, B, L, S = 12, 3, 2, 5, 7
F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-12}

DIMS = {"same": {}, "kv_narrow": {"kdim": 10, "vdim": 10}, "k_v_apart": {"kdim": 10, "vdim": 6}}
EXTRAS = [(False, False), (True, False), (False, True), (True, True)]  # add_bias_kv, zero_attn


def pair(seed=0, **kw):
    """A torch module and ours with the same weights (ours built with the same seed)."""
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(E, H, dtype=F64, **kw)
    torch.manual_seed(seed)
    ours = MultiheadAttention(E, H, dtype=F64, **kw)
    return theirs, ours


def inputs(batch_first, dims, self_attention, g):
    """query, key, value in the module's layout: self-attention passes one tensor three times."""
    kdim, vdim = dims.get("kdim", E), dims.get("vdim", E)
    n, s = (L, L) if self_attention else (L, S)

    def make(length, width):
        shape = (B, length, width) if batch_first else (length, B, width)
        return torch.randn(*shape, dtype=F64, generator=g)

    if self_attention:
        x = make(n, E)
        return x, x, x, n, n
    k = make(s, kdim)
    v = k if vdim == kdim else make(s, vdim)  # key is value when the widths allow
    return make(n, E), k, v, n, s


def masks(n, s, g):
    """Every mask form torch takes, none leaving a row without a key (torch gives NaN there)."""
    lengths = torch.tensor([s, max(1, s - 3)])
    pad = torch.arange(s)[None, :] >= lengths[:, None]  # (B, S) True = ignore
    blocked = torch.rand(n, s, generator=g) < 0.3
    blocked[:, 0] = False  # key 0 always allowed
    blocked3 = torch.rand(B * H, n, s, generator=g) < 0.3
    blocked3[..., 0] = False

    def as_float(b):
        return torch.randn(b.shape, dtype=F64, generator=g).masked_fill(b, float("-inf"))

    causal = torch.ones(n, s, dtype=torch.bool).triu(1)  # True = not allowed, top-left
    yield "none", {}
    yield "kpm bool", {"key_padding_mask": pad}
    yield "kpm float", {"key_padding_mask": as_float(pad)}
    yield "attn 2d bool", {"attn_mask": blocked}
    yield "attn 2d float", {"attn_mask": as_float(blocked)}
    yield "attn 3d bool", {"attn_mask": blocked3}
    yield "attn 3d float", {"attn_mask": as_float(blocked3)}
    yield "both bool", {"attn_mask": blocked, "key_padding_mask": pad}
    yield "both float", {"attn_mask": as_float(blocked3), "key_padding_mask": as_float(pad)}
    yield "bool attn, float kpm", {"attn_mask": blocked, "key_padding_mask": as_float(pad)}
    yield "causal", {"attn_mask": causal, "is_causal": True}
    yield "causal float", {"attn_mask": as_float(causal), "is_causal": True}
    yield "causal + kpm", {"attn_mask": causal, "is_causal": True, "key_padding_mask": pad}


WEIGHTS = [
    {"need_weights": False},
    {"need_weights": True},
    {"need_weights": True, "average_attn_weights": False},
]


def check_equal(theirs, ours, args, kwargs, what):
    with warnings.catch_warnings():  # torch: "mismatched key_padding_mask and attn_mask"
        warnings.simplefilter("ignore")
        want_out, want_w = theirs(*args, **kwargs)
    got_out, got_w = ours(*args, **kwargs)
    torch.testing.assert_close(got_out, want_out, **TOL, msg=lambda m: f"{what}: out {m}")
    assert (got_w is None) == (want_w is None), what
    if want_w is not None:
        torch.testing.assert_close(got_w, want_w, **TOL, msg=lambda m: f"{what}: weights {m}")


@pytest.mark.parametrize("extras", EXTRAS, ids=lambda e: f"bias_kv={e[0]},zero_attn={e[1]}")
@pytest.mark.parametrize("dims", list(DIMS), ids=str)
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
def test_equals_torch_for_every_mask_and_weights_option(batch_first, dims, extras):
    g = torch.Generator().manual_seed(1)
    theirs, ours = pair(
        dropout=0.1, batch_first=batch_first, add_bias_kv=extras[0], add_zero_attn=extras[1],
        **DIMS[dims],
    )  # fmt: skip
    theirs.eval(), ours.eval()  # dropout is set, and must not act in eval
    cases = [True, False] if dims == "same" else [False]
    for self_attention in cases:
        q, k, v, n, s = inputs(batch_first, DIMS[dims], self_attention, g)
        for (name, mask_kw), w_kw in itertools.product(masks(n, s, g), WEIGHTS):
            what = f"self={self_attention} {name} {w_kw}"
            check_equal(theirs, ours, (q, k, v), {**mask_kw, **w_kw}, what)


@pytest.mark.parametrize("batch_first", [False, True])
def test_no_bias_and_gradients_equal_torch(batch_first):
    theirs, ours = pair(bias=False, batch_first=batch_first)
    g = torch.Generator().manual_seed(2)
    q, k, v, _, s = inputs(batch_first, {}, False, g)
    pad = torch.zeros(B, s, dtype=torch.bool)
    pad[1, -2:] = True
    grads = []
    for m in (theirs, ours):
        qq = q.clone().requires_grad_()
        out, w = m(qq, k, v, key_padding_mask=pad, average_attn_weights=False)
        (out.square().sum() + w.sum()).backward()
        grads.append([qq.grad] + [p.grad for p in m.parameters()])
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("need_weights", [False, True])
def test_unbatched_input_equals_torch(need_weights):
    theirs, ours = pair(batch_first=True)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(L, E, dtype=F64, generator=g), torch.randn(S, E, dtype=F64, generator=g)
    pad = torch.tensor([False] * (S - 2) + [True] * 2)
    blocked = torch.rand(H, L, S, generator=g) < 0.3
    blocked[..., 0] = False
    for kw in ({}, {"key_padding_mask": pad}, {"attn_mask": blocked}, {"attn_mask": blocked[0]}):
        check_equal(theirs, ours, (q, k, k), {**kw, "need_weights": need_weights}, str(kw))
        check_equal(theirs, ours, (q, k, k), {**kw, "average_attn_weights": False}, str(kw))


def test_causal_hint_with_other_query_and_key_lengths_follows_torch():
    """is_causal without key padding or weights: torch runs SDPA's top-left causal limit over
    the keys (bias_k and the zero column included) and ignores attn_mask; with weights or key
    padding it uses attn_mask. attnkit does the same in both branches."""
    for extras in EXTRAS:
        theirs, ours = pair(add_bias_kv=extras[0], add_zero_attn=extras[1], batch_first=True)
        g = torch.Generator().manual_seed(4)
        q, k, v, n, s = inputs(True, {}, False, g)
        causal = torch.ones(n, s, dtype=torch.bool).triu(1)
        for w_kw in WEIGHTS:
            check_equal(theirs, ours, (q, k, v), {"attn_mask": causal, "is_causal": True, **w_kw},
                        f"{extras} {w_kw}")  # fmt: skip


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_a_row_that_sees_no_key_gives_zero_not_nan(batch_first, need_weights):
    theirs, ours = pair(batch_first=batch_first)
    g = torch.Generator().manual_seed(5)
    q, k, v, n, s = inputs(batch_first, {}, False, g)
    pad = torch.zeros(B, s, dtype=torch.bool)
    pad[1] = True  # sequence 1: every key ignored
    with torch.no_grad():
        want, _ = theirs(q, k, v, key_padding_mask=pad, need_weights=need_weights)
    qq = q.clone().requires_grad_()
    got, weights = ours(qq, k, v, key_padding_mask=pad, need_weights=need_weights)
    got.sum().backward()
    bf = (lambda t: t) if batch_first else (lambda t: t.transpose(0, 1))  # -> (B, L, E)
    # torch: NaN on its need_weights path (SDPA, without weights, gives 0 since torch 2.5)
    assert bf(want)[1].isnan().all() if need_weights else not want.isnan().any()
    assert not got.isnan().any() and qq.grad.isfinite().all()
    torch.testing.assert_close(bf(got)[1], ours.out_proj.bias.expand(n, E).detach())
    torch.testing.assert_close(bf(got)[0], bf(want)[0], **TOL)
    if not need_weights:
        torch.testing.assert_close(got, want, **TOL)
    if need_weights:
        assert (weights[1] == 0).all() and not weights.isnan().any()


def test_dropout_acts_in_training_only_and_weights_are_the_probabilities():
    theirs, ours = pair(dropout=0.5, batch_first=True)
    x = torch.randn(B, L, E, dtype=F64)
    ours.train()
    a, w = ours(x, x, x, average_attn_weights=False)
    b, _ = ours(x, x, x)
    assert not torch.allclose(a, b)  # dropout acts in training
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, L, dtype=F64))  # before dropout
    ours.eval(), theirs.eval()
    check_equal(theirs, ours, (x, x, x), {}, "eval")


@pytest.mark.parametrize("dims", list(DIMS), ids=str)
@pytest.mark.parametrize("extras", EXTRAS, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_state_dicts_load_unchanged_both_ways(dims, extras, bias):
    kw = dict(bias=bias, add_bias_kv=extras[0], add_zero_attn=extras[1], **DIMS[dims])
    torch.manual_seed(6)
    theirs = nn.MultiheadAttention(E, H, **kw)
    ours = MultiheadAttention(E, H, **kw)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())  # torch -> attnkit, strict
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other = MultiheadAttention(E, H, **kw)
    fresh = nn.MultiheadAttention(E, H, **kw)
    fresh.load_state_dict(other.state_dict())  # attnkit -> torch, strict
    for a, b in zip(fresh.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_saved_torch_checkpoint_loads_and_the_same_seed_gives_the_same_weights(tmp_path):
    torch.manual_seed(7)
    theirs = nn.MultiheadAttention(E, H, add_bias_kv=True)
    torch.save(theirs.state_dict(), tmp_path / "mha.pt")
    torch.manual_seed(7)
    ours = MultiheadAttention(E, H, add_bias_kv=True)  # same seed, same initial weights
    loaded = torch.load(tmp_path / "mha.pt", weights_only=True)
    for name, t in ours.state_dict().items():
        assert torch.equal(t, loaded[name]), name
    ours.load_state_dict(loaded)
    assert isinstance(ours, nn.MultiheadAttention)  # code that checks torch's type still works


def test_attnkit_converter_reads_the_drop_in():
    """attnkit.convert.from_torch takes the drop-in as it takes torch's module (one mapping)."""
    from attnkit.convert import from_torch

    _, ours = pair(batch_first=True)
    ak = from_torch(ours)
    x = torch.randn(B, L, E, dtype=F64)
    torch.testing.assert_close(ak(x), ours(x, x, x, need_weights=False)[0], **TOL)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((torch.randn(B, L, E + 1),) * 3, {}, "query must have shape"),
        ((torch.randn(B, L, E), torch.randn(B, S, E), torch.randn(B, S + 1, E)), {}, "share"),
        ((torch.randn(B, L, E),) * 3, {"is_causal": True}, "attn_mask"),
        ((torch.randn(B, L, E),) * 3, {"attn_mask": torch.zeros(L, L + 1)}, "attn_mask must"),
        ((torch.randn(B, L, E),) * 3, {"key_padding_mask": torch.zeros(B, L + 1)}, "key_padding"),
        ((torch.randn(B, L, E),) * 3, {"key_padding_mask": torch.zeros(B, L, dtype=torch.int64)},
         "boolean"),
        ((torch.randn(L, E), torch.randn(B, L, E), torch.randn(B, L, E)), {}, "rank"),
    ],
)  # fmt: skip
def test_bad_input_raises_value_error_naming_it(args, kwargs, match):
    ours = MultiheadAttention(E, H, batch_first=True)
    with pytest.raises(ValueError, match=match):
        ours(*args, **kwargs)


@st.composite
def calls(draw):
    """One module and one call: any combination of the constructor's and forward's options."""
    heads = draw(st.sampled_from([1, 2, 3, 4, 6]))
    dims = draw(st.sampled_from(list(DIMS)))
    module = {
        "num_heads": heads,
        "batch_first": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "add_bias_kv": draw(st.booleans()),
        "add_zero_attn": draw(st.booleans()),
        "dropout": draw(st.sampled_from([0.0, 0.3])),  # set, and the module is in eval
        **DIMS[dims],
    }
    call = {
        "unbatched": draw(st.booleans()),
        "self_attention": dims == "same" and draw(st.booleans()),
        "b": draw(st.integers(1, 3)),
        "n": draw(st.integers(1, 6)),
        "s": draw(st.integers(1, 6)),
        "kpm": draw(st.sampled_from(["none", "bool", "float"])),
        "attn": draw(st.sampled_from(["none", "2d bool", "2d float", "3d bool", "3d float"])),
        "need_weights": draw(st.booleans()),
        "average_attn_weights": draw(st.booleans()),
        "no_grad": draw(st.booleans()),  # torch's inference fast path where it applies
    }
    call["is_causal"] = call["attn"] != "none" and draw(st.booleans())
    return module, call, draw(st.integers(0, 2**16))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(calls())
def test_property_every_combination_equals_torch(case):
    """batch_first × kdim/vdim × bias × bias_kv/zero_attn × dropout in eval × unbatched ×
    self/cross × key padding (bool/float) × attn_mask (2-D/3-D, bool/float) × is_causal ×
    need_weights × average_attn_weights × with or without autograd: torch's numbers (float64,
    1e-12). Every mask leaves key 0 visible (a row that sees nothing is torch's NaN)."""
    module, call, seed = case
    g = torch.Generator().manual_seed(seed)
    heads = module.pop("num_heads")
    theirs, ours = _pair_heads(seed, heads, **module)
    theirs.eval(), ours.eval()
    b, n, s = call["b"], call["n"], call["s"]
    if call["self_attention"]:
        s = n
    kdim, vdim = module.get("kdim", E), module.get("vdim", E)

    def make(length, width):
        if call["unbatched"]:
            return torch.randn(length, width, dtype=F64, generator=g)
        shape = (b, length, width) if module["batch_first"] else (length, b, width)
        return torch.randn(*shape, dtype=F64, generator=g)

    q = make(n, E)
    k = q if call["self_attention"] else make(s, kdim)
    v = q if call["self_attention"] else (k if vdim == kdim else make(s, vdim))
    bb = 1 if call["unbatched"] else b
    kw = {k_: call[k_] for k_ in ("need_weights", "average_attn_weights", "is_causal")}
    if call["kpm"] != "none":
        pad = torch.rand(bb, s, generator=g) < 0.4
        pad[:, 0] = False
        pad = pad[0] if call["unbatched"] else pad
        kw["key_padding_mask"] = pad if call["kpm"] == "bool" else _as_float(pad, g)
    if call["attn"] != "none":
        shape = (n, s) if call["attn"].startswith("2d") else (bb * heads, n, s)
        blocked = torch.rand(*shape, generator=g) < 0.4
        blocked[..., 0] = False
        kw["attn_mask"] = blocked if call["attn"].endswith("bool") else _as_float(blocked, g)
    what = f"{module} {call} {seed}"
    if call["no_grad"]:
        with torch.no_grad():
            check_equal(theirs, ours, (q, k, v), kw, what)
    else:
        check_equal(theirs, ours, (q, k, v), kw, what)


def _as_float(blocked, g):
    return torch.randn(blocked.shape, dtype=F64, generator=g).masked_fill(blocked, float("-inf"))


def _pair_heads(seed, heads, **kw):
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(E, heads, dtype=F64, **kw)
    torch.manual_seed(seed)
    return theirs, MultiheadAttention(E, heads, dtype=F64, **kw)


def test_an_unmasked_call_without_weights_takes_attentions_short_path(monkeypatch):
    """need_weights=False and no mask: the heads go through `attention`'s short path
    (`_fast_path.plain_call`, SDPA unmasked), with torch's result."""
    module = importlib.import_module("attnkit.functional.attention")
    answers = []
    real = module.plain_call
    monkeypatch.setattr(module, "plain_call", lambda *a: answers.append(real(*a)) or answers[-1])
    theirs, ours = pair(batch_first=True)
    x = torch.randn(B, L, E, dtype=F64)
    got = ours(x, x, x, need_weights=False)[0]
    assert len(answers) == 1 and answers[0] is not None
    torch.testing.assert_close(got, theirs(x, x, x, need_weights=False)[0], **TOL)
