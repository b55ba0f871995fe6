"""DETR positions through the blocks and stacks, and DetrTransformer's own contracts.

The float64 references below write DETR's layer out by hand (Carion et al. 2020,
the `TransformerEncoderLayer.forward_post` / `TransformerDecoderLayer.forward_post`
of the DETR code): positions on queries and keys, never on values or the residual.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnkit import EncoderBlock
from attnkit.models import (
    DecoderBlock,
    DetrDecoder,
    DetrTransformer,
    KVCache,
    TransformerConfig,
)
from tests.naive import naive_attention

C, H = 12, 3


def rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def randomize(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.2)
    return m.eval()


def ref_mha(mha, q_in, k_in, v_in, mask=None):
    """MultiHeadAttention by hand from its weights: q from q_in, k from k_in, v from v_in."""
    w, b = mha.in_proj.qkv.weight, mha.in_proj.qkv.bias
    q = F.linear(q_in, w[:C], b[:C])
    k = F.linear(k_in, w[C : 2 * C], b[C : 2 * C])
    v = F.linear(v_in, w[2 * C :], b[2 * C :])
    split = lambda t: t.unflatten(-1, (H, -1)).transpose(1, 2)  # noqa: E731  (B, H, N, Dh)
    o, _ = naive_attention(split(q), split(k), split(v), mask=mask)
    return mha.proj(o.transpose(1, 2).flatten(2))


def key_mask(b, s):
    keep = torch.ones(b, s, dtype=torch.bool)
    keep[1, -3:] = False
    return keep


def test_encoder_block_adds_pos_to_queries_and_keys_only():
    block = randomize(
        EncoderBlock(C, H, 20, norm_first=False, activation="relu", dtype=torch.float64)
    )
    x, pos, keep = rand(2, 7, C), rand(2, 7, C, seed=1), key_mask(2, 7)
    mask = keep[:, None, None, :]
    got = block(x, mask=mask, pos=pos)
    a = block.attn
    y = a.norm(x + ref_mha(a.fn, x + pos, x + pos, x, mask))
    want = block.ff.norm(y + block.ff.fn(y))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # pre-norm: positions join after the norm (DETR's normalize_before)
    pre = randomize(EncoderBlock(C, H, 20, norm_first=True, dtype=torch.float64), seed=2)
    n = pre.attn.norm(x)
    y = x + ref_mha(pre.attn.fn, n + pos, n + pos, n, mask)
    torch.testing.assert_close(
        pre(x, mask=mask, pos=pos), y + pre.ff.fn(pre.ff.norm(y)), atol=1e-12, rtol=0
    )


def _cfg(**kw):
    return TransformerConfig(
        src_vocab=1, tgt_vocab=1, d_model=C, num_heads=H, d_ff=20, dropout=0.0, **kw
    )


def test_decoder_block_detr_positions_match_the_hand_written_layer():
    block = randomize(DecoderBlock(_cfg(), causal=False, dtype=torch.float64))
    x, memory = rand(2, 5, C), rand(2, 7, C, seed=1)
    qpos, pos, keep = rand(1, 5, C, seed=2), rand(2, 7, C, seed=3), key_mask(2, 7)
    got = block(x, memory, memory_mask=keep[:, None, None, :], pos=pos, query_pos=qpos)
    s, c, f = block.self_attn, block.cross_attn, block.ff
    y = s.norm(x + ref_mha(s.fn, x + qpos, x + qpos, x))  # no causal mask
    y = c.norm(y + ref_mha(c.fn, y + qpos, memory + pos, memory, keep[:, None, None, :]))
    want = f.norm(y + f.fn(y))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_decoder_block_is_causal_unless_built_otherwise():
    x, memory = rand(1, 6, C), rand(1, 4, C, seed=1)
    x2 = x.clone()
    x2[:, -1] += 1.0  # change only the last target position
    causal = randomize(DecoderBlock(_cfg(), dtype=torch.float64))
    assert torch.equal(causal(x, memory)[:, :-1], causal(x2, memory)[:, :-1])
    detr = randomize(DecoderBlock(_cfg(), causal=False, dtype=torch.float64))
    assert not torch.allclose(detr(x, memory)[:, :-1], detr(x2, memory)[:, :-1])


def test_cached_decoding_with_positions_equals_uncached():
    block = randomize(DecoderBlock(_cfg(), dtype=torch.float64))
    x, memory = rand(2, 6, C), rand(2, 7, C, seed=1)
    qpos, pos = rand(2, 6, C, seed=2), rand(2, 7, C, seed=3)
    mmask = key_mask(2, 7)[:, None, None, :]
    want = block(x, memory, memory_mask=mmask, pos=pos, query_pos=qpos)
    cache, steps = KVCache(), []
    for t0, t1 in ((0, 2), (2, 3), (3, 6)):  # several tokens, then one, then three
        steps.append(
            block(
                x[:, t0:t1],
                memory,
                memory_mask=mmask,
                cache=cache,
                pos=pos,
                query_pos=qpos[:, t0:t1],
            )
        )
    torch.testing.assert_close(torch.cat(steps, 1), want, atol=1e-12, rtol=0)


def test_intermediate_outputs_are_each_layer_through_the_final_norm():
    layers = [DecoderBlock(_cfg(), causal=False, dtype=torch.float64) for _ in range(3)]
    norm = torch.nn.LayerNorm(C, dtype=torch.float64)
    dec = randomize(DetrDecoder(layers, norm, return_intermediate=True))
    tgt, memory, qpos = rand(2, 4, C), rand(2, 6, C, seed=1), rand(1, 4, C, seed=2)
    hs = dec(tgt, memory, query_pos=qpos)
    assert hs.shape == (3, 2, 4, C)
    x, want = tgt, []
    for layer in layers:
        x = layer(x, memory, query_pos=qpos)  # the stream is not normalised in between
        want.append(norm(x))
    torch.testing.assert_close(hs, torch.stack(want), atol=1e-12, rtol=0)
    dec.return_intermediate = False
    last = dec(tgt, memory, query_pos=qpos)
    assert last.shape == (1, 2, 4, C) and torch.equal(last[0], hs[-1])


def small_detr(**kw):
    torch.manual_seed(0)
    return randomize(DetrTransformer(C, H, 2, 2, 20, 0.0, 4, dtype=torch.float64, **kw))


def test_detr_transformer_queries_start_at_zero_and_padding_is_ignored():
    model = small_detr()
    src, pos, keep = rand(2, 9, C), rand(2, 9, C, seed=1), key_mask(2, 9)
    hs, memory = model(src, keep, pos)
    assert hs.shape == (1, 2, 4, C) and memory.shape == (2, 9, C)
    # the decoder on its own, fed zeros and the query embedding as positions
    qpos = model.query_embed.weight[None]
    torch.testing.assert_close(
        model.decoder(torch.zeros(2, 4, C, dtype=torch.float64), memory, memory_key_mask=keep,
                      pos=pos, query_pos=qpos),
        hs,
        atol=0,
        rtol=0,
    )  # fmt: skip
    # what sits in the padding (content and positions) changes nothing at real positions
    src2, pos2 = src.clone(), pos.clone()
    src2[1, -3:] += 5.0
    pos2[1, -3:] -= 3.0
    hs2, memory2 = model(src2, keep, pos2)
    torch.testing.assert_close(hs2, hs, atol=1e-12, rtol=0)
    torch.testing.assert_close(memory2[:, :-3], memory[:, :-3], atol=1e-12, rtol=0)


def test_object_queries_are_a_set():
    """Permuting the learned queries permutes the outputs: no order among the slots."""
    model = small_detr(return_intermediate=True)
    src, pos = rand(2, 9, C), rand(2, 9, C, seed=1)
    hs, _ = model(src, None, pos)
    perm = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        model.query_embed.weight.copy_(model.query_embed.weight[perm])
    hs_perm, _ = model(src, None, pos)
    torch.testing.assert_close(hs_perm, hs[:, :, perm], atol=1e-12, rtol=0)


def test_an_image_with_no_real_pixel_gives_numbers_not_nan():
    model = small_detr()
    keep = torch.zeros(2, 9, dtype=torch.bool)
    hs, memory = model(rand(2, 9, C), keep, rand(2, 9, C, seed=1))
    assert torch.isfinite(hs).all() and torch.isfinite(memory).all()


def test_bad_inputs_name_the_argument():
    model = small_detr()
    with pytest.raises(ValueError, match=r"src must have shape \(B, S, 12\), got \(2, 9, 8\)"):
        model(rand(2, 9, 8))
    with pytest.raises(ValueError, match=r"src_key_mask must be bool of shape \(B, S\)"):
        model(rand(2, 9, C), torch.ones(2, 9))
    with pytest.raises(ValueError, match=r"src_key_mask .* got torch.bool \(2, 8\)"):
        model(rand(2, 9, C), torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"pos must have shape \(B, S, C\) = \(2, 9, 12\)"):
        model(rand(2, 9, C), None, rand(2, 8, C))
    with pytest.raises(ValueError, match="nhead=5"):
        DetrTransformer(C, 5)
    with pytest.raises(ValueError, match="num_queries"):
        DetrTransformer(C, H, num_queries=0)


def test_docs_detr_md_runs():
    pytest.importorskip("transformers")
    from tests.test_readme import run_python_blocks

    docs = Path(__file__).resolve().parents[2] / "docs" / "en" / "guides" / "detr.md"
    namespace = run_python_blocks(docs)
    assert namespace["hs"].shape == (1, 2, 7, 32)  # the converted model, no intermediates
