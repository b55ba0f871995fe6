"""Position modules inside attention: MultiHeadAttention(rotary=), the KV-cached decoder, Llama."""

from __future__ import annotations

import copy

import pytest
import torch

from attnkit import (
    BACKENDS,
    AlibiBias,
    MultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
)
from attnkit.models.decoding import CachedMultiHeadAttention, KVCache
from tests.naive import naive_attention


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_mha_with_rotary_on_every_backend_against_float64(backend, interleaved):
    torch.manual_seed(0)
    m = MultiHeadAttention(
        24, 4, num_kv_heads=2, rotary=RotaryEmbedding(4, interleaved=interleaved), backend=backend
    ).eval()
    x = rand(2, 9, 24)
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    mask[1, 0, 4] = False  # a query that may attend to nothing
    with torch.no_grad():
        got = m(x, mask=mask, causal=True)
        m64 = copy.deepcopy(m).double()
        q, k, v = m64.heads_qkv(x.double())
        q, k = m64.rotary(q, k)
        o, _ = naive_attention(q, k, v, mask=mask, causal=True)
        want = m64.proj(MultiHeadAttention.merge_heads(o))
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
    # the fully masked query gives attention output 0: proj(0) = the output bias
    torch.testing.assert_close(got[1, 4], m.proj.bias, rtol=0, atol=0)


def test_rotary_changes_the_output_and_breaks_permutation_equivariance():
    torch.manual_seed(0)
    plain = MultiHeadAttention(16, 2).eval()
    rope = copy.deepcopy(plain)
    rope.rotary = RotaryEmbedding(8)
    x, perm = rand(1, 6, 16), torch.tensor([5, 3, 1, 0, 2, 4])
    with torch.no_grad():
        torch.testing.assert_close(plain(x[:, perm]), plain(x)[:, perm])
        assert (rope(x[:, perm]) - rope(x)[:, perm]).abs().max() > 1e-3


def test_llama_attention_parity_on_random_weights():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    b, n, h, hkv, d = 2, 10, 4, 2, 16
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=h, num_key_value_heads=hkv,
                      head_dim=d, rope_theta=10000.0, attention_bias=False)  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = LlamaAttention(cfg, layer_idx=0).eval()
    ours = MultiHeadAttention(64, h, num_kv_heads=hkv, qkv_bias=False, out_bias=False,
                              rotary=RotaryEmbedding(d)).eval()  # fmt: skip
    with torch.no_grad():
        w = torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight])
        ours.in_proj.qkv.weight.copy_(w)
        ours.proj.weight.copy_(theirs.o_proj.weight)
        x = rand(b, n, 64)
        ids = torch.arange(n)[None].expand(b, n)
        cos_sin = LlamaRotaryEmbedding(cfg)(x, ids)
        blocked = torch.ones(n, n, dtype=torch.bool).triu(1)
        additive = torch.zeros(n, n).masked_fill(blocked, torch.finfo(torch.float32).min)
        want, _ = theirs(x, position_embeddings=cos_sin, attention_mask=additive[None, None])
        got = ours(x, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def cached_decoder(seed=0, **kw):
    torch.manual_seed(seed)
    return CachedMultiHeadAttention(24, 6, num_kv_heads=3, **kw).eval()


def decode_in_steps(m, x, steps, bias_for=None):
    """Feed x (B, T, C) in chunks of `steps` lengths through a KVCache; concat the outputs."""
    cache, outs, start = KVCache(), [], 0
    for size in steps:
        end = start + size
        bias = None if bias_for is None else bias_for(size, end)  # N new of S = end keys
        outs.append(m(x[:, start:end], causal=True, cache=cache, bias=bias))
        cache.length = end
        start = end
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("interleaved", [False, True])
def test_cached_decode_with_rotary_equals_the_full_forward(interleaved):
    m = cached_decoder(rotary=RotaryEmbedding(4, interleaved=interleaved))
    x = rand(2, 9, 24)
    with torch.no_grad():
        full = m(x, causal=True)
        stepped, cache = decode_in_steps(m, x, [4, 1, 1, 3])
    torch.testing.assert_close(stepped, full, rtol=0, atol=1e-6)
    assert cache.entries[m][0].shape[2] == cache.length == 9


@pytest.mark.parametrize("kind", ["alibi", "t5"])
def test_cached_decode_with_position_bias_equals_the_full_forward(kind):
    m = cached_decoder()
    torch.manual_seed(1)
    pos = AlibiBias(6) if kind == "alibi" else RelativePositionBias(6, bidirectional=False)
    pos.requires_grad_(False)
    x = rand(2, 9, 24)
    with torch.no_grad():
        full = m(x, causal=True, bias=pos(9))
        stepped, _ = decode_in_steps(m, x, [3, 1, 2, 3], bias_for=lambda n, s: pos(n, s))
    torch.testing.assert_close(stepped, full, rtol=0, atol=1e-6)


def test_rotary_is_refused_with_a_context_and_when_wider_than_a_head():
    m = MultiHeadAttention(16, 2, rotary=RotaryEmbedding(8))
    with pytest.raises(ValueError, match="rotary positions are for self-attention"):
        m(rand(1, 3, 16), rand(1, 4, 16))
    c = CachedMultiHeadAttention(16, 2, rotary=RotaryEmbedding(8))
    with pytest.raises(ValueError, match="rotary positions are for self-attention"):
        c(rand(1, 3, 16), rand(1, 4, 16), cache=KVCache())
    with pytest.raises(ValueError, match=r"rotary\.dim=10 exceeds head_dim=8"):
        MultiHeadAttention(16, 2, rotary=RotaryEmbedding(10))


def test_built_on_meta_used_then_materialised_rebuilds_the_tables():
    from attnkit.modules import reset_parameters

    rope = RotaryEmbedding(8, device="meta")
    rope.rotate(torch.zeros(1, 1, 100, 8, device="meta"))  # tables grown on meta
    rope.to_empty(device="cpu")
    reset_parameters(rope)  # drops the uninitialised tables
    x = rand(1, 2, 5, 8)
    torch.testing.assert_close(rope.rotate(x, 3), RotaryEmbedding(8).rotate(x, 3))


def test_alibi_module_follows_to_and_reset():
    alibi = AlibiBias(5).double()
    assert alibi(3, 4).dtype == torch.float64 and alibi.state_dict() == {}
    torch.testing.assert_close(alibi(3, 4, positions=torch.arange(4)[None]), alibi(3, 4))


def test_rotary_mha_compiles_with_fullgraph():
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 2, rotary=RotaryEmbedding(8)).eval()
    x = rand(2, 7, 16)
    with torch.no_grad():
        want = m(x, causal=True)
        got = torch.compile(copy.deepcopy(m), fullgraph=True)(x, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
