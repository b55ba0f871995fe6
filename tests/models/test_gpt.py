from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnkit.models import GPT, CausalLM, GPTConfig, KVCache, TransformerConfig
from attnkit.modules.attention import Attend
from attnkit.modules.reset import reset_parameters
from tests.naive import naive_attention

V = 11  # ids 0..10, all real tokens


def make(dtype=torch.float32, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        **{"vocab_size": V, "n_layer": 2, "n_head": 2, "d_model": 12, "context": 16, **kw}
    )
    return GPT(cfg, dtype=dtype).eval()


def ids(b: int, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, n), generator=g)


def naive_gpt(m: GPT, x: torch.Tensor) -> torch.Tensor:
    """The same network written out with plain float64 tensor ops (GPT-2's equations)."""
    sd = {k: t.double() for k, t in m.state_dict().items()}
    cfg = m.cfg
    n, h = x.shape[1], cfg.n_head

    def ln(t, name):
        return F.layer_norm(
            t, (cfg.d_model,), sd[f"{name}.weight"], sd[f"{name}.bias"], cfg.norm_eps
        )

    def lin(t, name):
        return t @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]

    z = sd["tokens.weight"][x] + sd["positions.weight"][:n]  # (B, N, C)
    for i in range(cfg.n_layer):
        p = f"blocks.{i}"
        q, k, v = lin(ln(z, f"{p}.attn.norm"), f"{p}.attn.fn.in_proj.qkv").chunk(3, -1)
        heads = [t.unflatten(-1, (h, -1)).transpose(1, 2) for t in (q, k, v)]  # (B, H, N, Dh)
        o, _ = naive_attention(*heads, causal=True)
        z = z + lin(o.transpose(1, 2).flatten(2), f"{p}.attn.fn.proj")
        y = ln(z, f"{p}.ff.norm")
        z = z + lin(F.gelu(lin(y, f"{p}.ff.fn.fc1")), f"{p}.ff.fn.fc2")
    return ln(z, "norm") @ sd["tokens.weight"].T  # tied head


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpt_equals_a_float64_naive_gpt(dtype):
    m = make(dtype)
    x = ids(3, 9)
    atol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(m(x).double(), naive_gpt(m, x), atol=atol, rtol=0)


def test_head_is_tied_to_the_token_table_and_survives_to_empty():
    m = GPT(GPTConfig(V, 1, 2, 8, 8), device="meta")
    assert m.head.weight is m.tokens.weight
    m.to_empty(device="cpu")
    assert m.head.weight is m.tokens.weight
    reset_parameters(m)
    assert abs(float(m.tokens.weight.detach().std()) - 0.02) < 0.01  # GPT-2's N(0, 0.02)


@pytest.mark.parametrize("capacity", [None, 16], ids=["growing", "preallocated"])
def test_cached_equals_full_forward_with_token_zero_real(capacity):
    m = make()
    x = ids(2, 10)
    x[:, ::3] = 0  # id 0 is a real token, not padding
    full = m(x)
    cache = KVCache(capacity=capacity)
    steps = [m(x[:, :4], cache=cache)] + [m(x[:, i : i + 1], cache=cache) for i in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert cache.length == 10


def test_one_token_step_over_a_cache_attends_without_mask_or_causal():
    m = make()
    seen = []
    for mod in m.modules():
        if isinstance(mod, Attend):
            hook = lambda _, args, kw: seen.append((args[0].shape[2], kw.get("mask"), kw["causal"]))  # noqa: E731
            mod.register_forward_pre_hook(hook, with_kwargs=True)
    cache = KVCache(capacity=16)
    with torch.no_grad():
        m(ids(1, 5), cache=cache)
        seen.clear()
        m(ids(1, 1), cache=cache)
    assert seen == [(1, None, False)] * m.cfg.n_layer


def test_left_padded_rows_equal_each_row_alone():
    m = make()
    a, b = ids(1, 7), ids(1, 4, seed=2)
    x = torch.cat([a, torch.cat([torch.full((1, 3), 5), b], 1)])  # row 1 left-padded by 3
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, :3] = False
    got = m(x, attention_mask=mask)
    torch.testing.assert_close(got[0], m(a)[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1, 3:], m(b)[0], atol=1e-5, rtol=0)
    assert torch.isfinite(got).all()  # padding queries see no key: 0, not NaN
    # and cached: one more token per row, the mask growing by one real column
    cache = KVCache(capacity=16)
    m(x, cache=cache, attention_mask=mask)
    new = ids(2, 1, seed=3)
    step = m(
        new, cache=cache, attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.bool)], 1)
    )
    torch.testing.assert_close(step[1, 0], m(torch.cat([b, new[1:]], 1))[0, -1], atol=1e-5, rtol=0)


def test_loss_is_plain_next_token_cross_entropy_and_grads_are_finite():
    m = make().train()
    x = ids(2, 9)
    loss = m.loss(x)
    want = F.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    torch.testing.assert_close(loss, want)
    loss.backward()
    grads = [p.grad for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert 1.5 < float(loss) < 2 * math.log(V)  # near log V at initialisation


def test_pad_id_labels_are_ignored_and_all_ignored_gives_zero_not_nan():
    m = make(pad_id=3)
    x = ids(2, 6)
    x[x == 3] = 4
    padded = torch.cat([x, torch.full((2, 4), 3)], 1)  # right padding: no key mask needed
    torch.testing.assert_close(m.loss(padded), m.loss(x), atol=1e-6, rtol=0)
    only_pad = torch.full((2, 5), 3)
    loss = m.train().loss(only_pad)
    loss.backward()
    assert float(loss) == 0.0
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_positions_beyond_the_context_are_an_error():
    with pytest.raises(ValueError, match=r"positions 0\.\.16 exceed max_len=16"):
        make()(ids(1, 17))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(d_model=10, n_head=4), "d_model=10 must be divisible by n_head=4"),
        (dict(context=0), "context"),
        (dict(dropout=1.5), "dropout"),
        (dict(activation="tanh"), "activation must be one of"),
        (dict(pad_id=11), "pad_id must be None or a token id < 11, got 11"),
    ],
)
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{"vocab_size": V, "n_layer": 1, "n_head": 2, "d_model": 8, "context": 8, **kw})


def test_input_errors():
    m = make()
    with pytest.raises(ValueError, match=r"ids must be integer token ids of shape \(B, N\)"):
        m(torch.randn(2, 3))
    with pytest.raises(
        ValueError, match=r"attention_mask must have shape \(B, cached \+ new\) = \(2, 3\)"
    ):
        m(ids(2, 3), attention_mask=torch.ones(2, 4))


def test_preallocated_cache_refuses_to_overflow_and_reorders():
    m = make()
    cache = KVCache(capacity=4)
    m(ids(3, 4), cache=cache)
    with pytest.raises(ValueError, match=r"KVCache\(capacity=4\) is full: 4 keys cached, 1 new"):
        m(ids(3, 1), cache=cache)
    mod = next(iter(cache.entries))
    before = cache.entries[mod][0].clone()
    cache.reorder(torch.tensor([2, 0]))
    k2, _ = cache.entries[mod]
    assert torch.equal(k2, before[[2, 0]])
    assert k2.data_ptr() == cache.buffers[mod][0].data_ptr()  # still a view of the buffer
    assert cache.nbytes() == 2 * m.cfg.n_layer * 2 * 2 * 4 * 6 * 4  # K,V x layers x B,H,S,Dh x 4 B


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity must be None or an integer >= 1, got 0"):
        KVCache(capacity=0)


# CausalLM: every id is a real token unless pad_id is given


def causal_lm(**kw) -> CausalLM:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab=V, tgt_vocab=V, d_model=16, num_heads=2, d_ff=32, decoder_layers=2,
        max_len=16, dropout=0.0, norm_first=True, positions="learned", label_smoothing=0.0, **kw,
    )  # fmt: skip
    return CausalLM(cfg).eval()


def test_causal_lm_default_has_no_pad_and_caches_exactly_with_token_zero():
    lm = causal_lm()
    assert lm.cfg.pad_id is None
    x = ids(2, 9)
    x[:, 1::2] = 0
    full = lm(x)
    cache = KVCache()
    steps = [lm(x[:, :3], cache=cache)] + [lm(x[:, i : i + 1], cache=cache) for i in range(3, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    want = F.cross_entropy(lm(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())  # zeros count
    torch.testing.assert_close(lm.loss(x), want)


def test_causal_lm_loss_with_only_pad_labels_is_zero_not_nan():
    lm = causal_lm(pad_id=0)
    assert float(lm.loss(torch.tensor([[5, 0, 0, 0]]))) == 0.0


def test_rotary_gpt_has_no_position_table_and_caches_exactly():
    m = make(torch.float64, rotary=True)
    assert m.positions is None
    assert all(b.attn.fn.rotary is not None for b in m.blocks)
    assert not any("positions" in name for name in m.state_dict())
    x = ids(2, 10)
    full = m(x)
    cache = KVCache(capacity=16)
    steps = [m(x[:, :4], cache=cache)] + [m(x[:, i : i + 1], cache=cache) for i in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=0)


def test_rotary_gpt_sees_order_and_only_relative_positions():
    """Swapping two earlier tokens changes the last prediction (RoPE is applied); the same
    tokens after a left-padded prefix give the same logits (only distances count)."""
    m = make(torch.float64, rotary=True)
    x = ids(1, 6)
    swapped = x[:, [1, 0, 2, 3, 4, 5]]
    assert not torch.allclose(m(x)[:, -1], m(swapped)[:, -1])
    padded = torch.cat([torch.zeros(1, 3, dtype=x.dtype), x], 1)
    mask = torch.tensor([[0, 0, 0] + [1] * 6])
    torch.testing.assert_close(m(padded, attention_mask=mask)[:, 3:], m(x), atol=1e-12, rtol=0)
