from __future__ import annotations

import pytest
import torch

from attnkit.models import KVCache, Transformer, beam_search, greedy, preset
from attnkit.modules.attention import MultiHeadAttention

V, BOS, EOS, PAD = 11, 1, 2, 0


def make(norm_first: bool, positions: str = "sinusoidal") -> Transformer:
    torch.manual_seed(0)
    cfg = preset(
        "tiny",
        src_vocab=V,
        tgt_vocab=V,
        norm_first=norm_first,
        positions=positions,
        dropout=0.1,  # eval mode: must not matter
        pad_id=PAD,
    )
    return Transformer(cfg).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(3, V, (3, 9), generator=g)
    src[0, 5:] = PAD  # ragged sources
    src[2, 7:] = PAD
    tgt = torch.randint(3, V, (3, 12), generator=g)
    tgt[:, 0] = BOS
    return src, tgt


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_equals_full_recomputation_at_every_step(norm_first, positions):
    model = make(norm_first, positions)
    src, tgt = padded_batch()
    memory, memory_mask = model.encode(src)
    cache = KVCache()
    with torch.no_grad():
        for t in range(tgt.shape[1]):
            step = model.decode(tgt[:, t : t + 1], memory, memory_mask, cache=cache)  # (B, 1, V)
            full = model.decode(tgt[:, : t + 1], memory, memory_mask)  # (B, t + 1, V)
            assert (step[:, 0] - full[:, -1]).abs().max() <= 1e-5, f"step {t}"
    assert cache.length == tgt.shape[1]


def test_cache_takes_several_new_tokens_at_once():
    model = make(True)
    src, tgt = padded_batch()
    memory, mask = model.encode(src)
    cache = KVCache()
    with torch.no_grad():
        a = model.decode(tgt[:, :5], memory, mask, cache=cache)  # prompt of 5
        b = model.decode(tgt[:, 5:8], memory, mask, cache=cache)  # 3 new: bottom-right causal
        full = model.decode(tgt[:, :8], memory, mask)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-5, rtol=0)


def test_cross_attention_keys_values_are_projected_once():
    model = make(False)
    src, _ = padded_batch()
    seen = []  # context lengths given to heads_qkv by cross-attentions
    originals = {}
    for block in model.decoder:
        mha = block.cross_attn.fn
        originals[mha] = mha.heads_qkv

        def spy(x, context=None, _orig=mha.heads_qkv, **kw):
            seen.append(context.shape[1])
            return _orig(x, context, **kw)

        mha.heads_qkv = spy
    greedy(model, src, bos=BOS, eos=EOS, pad=PAD, max_len=6)
    layers = len(model.decoder)
    assert seen[:layers] == [src.shape[1]] * layers  # first step: the whole source
    assert set(seen[layers:]) == {0}  # later steps project the queries only
    assert all(isinstance(m, MultiHeadAttention) for m in originals)  # one attention class


def naive_greedy(model, src, max_len):
    """Greedy by full recomputation of the prefix at every step (no cache)."""
    memory, mask = model.encode(src)
    tgt = torch.full((src.shape[0], 1), BOS)
    for _ in range(max_len):
        nxt = model.decode(tgt, memory, mask)[:, -1].argmax(-1, keepdim=True)
        tgt = torch.cat([tgt, nxt], 1)
    return tgt[:, 1:]


@pytest.mark.parametrize("norm_first", [False, True])
def test_greedy_matches_recomputation(norm_first):
    model = make(norm_first)
    src, _ = padded_batch()
    with torch.no_grad():
        want = naive_greedy(model, src, 8)
    got = greedy(model, src, bos=BOS, eos=EOS, pad=PAD, max_len=8)
    for g, w in zip(got.tolist(), want.tolist(), strict=True):
        end = g.index(EOS) + 1 if EOS in g else len(g)
        assert g[:end] == w[:end]
        assert all(t == PAD for t in g[end:])


def test_beam_search_one_beam_is_greedy():
    model = make(True)
    src, _ = padded_batch()
    kw = dict(bos=BOS, eos=EOS, pad=PAD, max_len=7)
    g = greedy(model, src, **kw)
    b1 = beam_search(model, src, beam_size=1, length_penalty=0.0, **kw)
    assert torch.equal(b1[:, : g.shape[1]], g)


def test_beam_search_with_a_beam_per_token_is_exhaustive():
    """max_len 2, beam V: the best of all V·V continuations (EOS ends a sequence)."""
    model = make(False)
    src, _ = padded_batch()
    with torch.no_grad():
        memory, mask = model.encode(src)
        first = model.decode(torch.full((3, 1), BOS), memory, mask)[:, -1].log_softmax(-1)
        pairs = torch.stack([torch.full((3, V), BOS), torch.arange(V).expand(3, V)], -1).view(
            3 * V, 2
        )  # (B·V, 2): BOS y1 for every y1
        rep = lambda t: t.repeat_interleave(V, 0)  # noqa: E731
        second = model.decode(pairs, rep(memory), rep(mask))[:, -1].log_softmax(-1).view(3, V, V)
    total = first[:, :, None] + second  # (B, y1, y2)
    total[:, EOS, :] = first[:, EOS, None]  # a sequence that ended costs nothing more
    best = total.flatten(1).argmax(-1)  # (B,)
    y1, y2 = best // V, best % V
    got = beam_search(
        model, src, bos=BOS, eos=EOS, pad=PAD, max_len=2, beam_size=V, length_penalty=0.0
    )
    assert got[:, 0].tolist() == y1.tolist()
    for row, a, b in zip(got.tolist(), y1.tolist(), y2.tolist(), strict=True):
        if a != EOS:
            assert row[1] == b


def test_cache_reorder_selects_rows():
    cache = KVCache()
    k = torch.arange(4.0).view(4, 1, 1, 1)
    cache.entries["m"] = (k, k + 10)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.entries["m"][0].flatten().tolist() == [2.0, 2.0, 0.0]
    assert cache.entries["m"][1].flatten().tolist() == [12.0, 12.0, 10.0]


def test_decoding_errors():
    model = make(False)
    with pytest.raises(ValueError, match=r"src must be integer token ids of shape \(B, S\)"):
        greedy(model, torch.randn(2, 3), bos=BOS, eos=EOS, pad=PAD, max_len=3)
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        greedy(model, torch.ones(1, 3, dtype=torch.long), bos=BOS, eos=EOS, pad=PAD, max_len=0)
    with pytest.raises(ValueError, match="beam_size must be >= 1, got 0"):
        beam_search(
            model,
            torch.ones(1, 3, dtype=torch.long),
            bos=BOS,
            eos=EOS,
            pad=PAD,
            max_len=3,
            beam_size=0,
        )


def test_alignment_png_is_a_model_view_with_source_keys(tmp_path):
    import pytest

    from attnkit.seq2seq.alignment import save_alignment_png

    maps = torch.softmax(torch.randn(2, 3, 4, 5), -1)  # (L, H, T, S)
    path = save_alignment_png(maps, list("abcde"), list("wxyz"), tmp_path / "a.png", title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="key_tokens"):
        save_alignment_png(maps, list("abc"), list("wxyz"), tmp_path / "b.png")
