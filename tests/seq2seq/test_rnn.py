"""RNN encoder-decoders: shapes, padding, attention weights, gradients, cached decoding,
a float64 reference of the decoder step, and a short training run."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from attnkit.models.decoding import KVCache, beam_search, greedy
from attnkit.models.rnn import ATTENTIONS, CELLS, RNNConfig, RNNSeq2Seq
from attnkit.seq2seq.tasks import Task, make_batch

V = 11
# two sources of different lengths, right-padded; decoder inputs BOS y1 y2 y3
SRC = torch.tensor([[3, 4, 5, 6, 2], [7, 8, 2, 0, 0]])
TGT = torch.tensor([[1, 6, 5, 4], [1, 8, 7, 2]])
KINDS = [(c, a) for c in CELLS for a in ATTENTIONS]


def model(cell="gru", attention="additive", dtype=torch.float32, **kw) -> RNNSeq2Seq:
    torch.manual_seed(0)
    cfg = RNNConfig(vocab=V, cell=cell, attention=attention, embed_dim=6, hidden=8, **kw)
    return RNNSeq2Seq(cfg, dtype=dtype).eval()


@pytest.mark.parametrize(("cell", "attention"), KINDS)
def test_shapes(cell, attention):
    m = model(cell, attention)
    memory, mask = m.encode(SRC)
    s = 1 if attention == "none" else SRC.shape[1]  # no attention: the final state alone
    assert memory.shape == (2, s, 8) and mask.shape == (2, 1, 1, s) and mask.dtype == torch.bool
    assert m(SRC, TGT).shape == (2, 4, V)


@pytest.mark.parametrize(("cell", "attention"), KINDS)
def test_padding_never_changes_a_row(cell, attention):
    """A row decoded alone equals the same row inside a batch padded to a longer source."""
    m = model(cell, attention)
    both = m(SRC, TGT)
    alone = m(SRC[1:, :3], TGT[1:])  # the second row without its padding
    torch.testing.assert_close(both[1:], alone, atol=1e-6, rtol=1e-5)
    wider = F.pad(SRC, (0, 3))  # three more padding columns for everyone
    torch.testing.assert_close(m(wider, TGT), both, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", ["additive", "dot", "general"])
def test_attention_weights_sum_to_one_over_real_keys(attention):
    w = model("lstm", attention).alignment(SRC, TGT)  # (B, T, S)
    assert w.shape == (2, 4, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4))
    assert (w[1, :, 3:] == 0).all() and (w >= 0).all()  # padded keys get nothing


def test_alignment_of_the_model_without_attention_is_refused():
    with pytest.raises(ValueError, match="no alignment"):
        model(attention="none").alignment(SRC, TGT)


@pytest.mark.parametrize(("cell", "attention"), KINDS)
def test_gradients_are_finite_and_reach_every_parameter(cell, attention):
    m = model(cell, attention).train()
    tgt = torch.cat([TGT, torch.tensor([[2], [0]])], dim=1)  # BOS y... EOS PAD
    m.loss(SRC, tgt).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name != "embed.weight":
            assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(("cell", "attention"), KINDS)
def test_cached_step_by_step_decoding_equals_teacher_forcing(cell, attention):
    m = model(cell, attention)
    memory, mask = m.encode(SRC)
    full = m.decode(TGT, memory, mask)
    cache = KVCache()
    steps = [m.decode(TGT[:, t : t + 1], memory, mask, cache=cache) for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-5)
    assert cache.length == 4


@pytest.mark.parametrize("cell", CELLS)
def test_beam_of_one_is_greedy(cell):
    m = model(cell, "dot")
    kw = {"bos": 1, "eos": 2, "pad": 0, "max_len": 7}
    assert torch.equal(beam_search(m, SRC, beam_size=1, **kw), greedy(m, SRC, **kw))
    assert beam_search(m, SRC, beam_size=3, **kw).shape[0] == 2


def _reference_logits(m: RNNSeq2Seq, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """The decoder of the module docstring written out for one unpadded row, in float64,
    from the model's weights (the encoder is torch's nn.GRU/nn.LSTM, run unpacked)."""
    cfg, p = m.cfg, dict(m.named_parameters())
    h2 = cfg.hidden // 2
    memory, _ = m.encoder(m.embed(src))  # (1, S, H) = [forward; backward]
    final = torch.cat([memory[0, -1, :h2], memory[0, 0, h2:]])  # (H,)
    s = torch.tanh(p["bridge.weight"] @ final + p["bridge.bias"])
    c = torch.zeros_like(s)
    fed = torch.zeros_like(s)
    keys = memory[0]  # (S, H)

    def attend(q):
        if cfg.attention == "additive":
            a = p["attention.q_proj.weight"] @ q + p["attention.q_proj.bias"]
            e = torch.tanh(a + keys @ p["attention.k_proj.weight"].T) @ p["attention.v"]
        elif cfg.attention == "general":
            e = keys @ p["attention.general.weight"].T @ q * p["attention.scale"]
        else:
            e = keys @ q * p["attention.scale"]
        return torch.softmax(e, 0) @ keys

    def cell(x, s, c):
        gates_i = p["cell.weight_ih"] @ x + p["cell.bias_ih"]
        gates_h = p["cell.weight_hh"] @ s + p["cell.bias_hh"]
        if cfg.cell == "gru":  # torch's GRU equations
            r_i, z_i, n_i = gates_i.chunk(3)
            r_h, z_h, n_h = gates_h.chunk(3)
            r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
            n = torch.tanh(n_i + r * n_h)
            return (1 - z) * n + z * s, c
        i, f, g, o = (gates_i + gates_h).chunk(4)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    logits = []
    for token in tgt[0]:
        y = m.embed.weight[token]
        if cfg.attention in ("dot", "general"):
            s, c = cell(torch.cat([y, fed]), s, c)
            ctx = attend(s)
        else:
            ctx = final if cfg.attention == "none" else attend(s)
            s, c = cell(torch.cat([y, ctx]), s, c)
        fed = torch.tanh(p["combine.weight"] @ torch.cat([s, ctx]) + p["combine.bias"])
        logits.append(p["generator.weight"] @ fed + p["generator.bias"])
    return torch.stack(logits)[None]


@pytest.mark.parametrize(("cell", "attention"), KINDS)
def test_decoder_matches_a_float64_reference(cell, attention):
    m = model(cell, attention, dtype=torch.float64)
    got = m(SRC[:1], TGT[:1])
    with torch.no_grad():
        want = _reference_logits(m, SRC[:1], TGT[:1])
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_config_and_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="cell must be one of"):
        RNNConfig(vocab=5, cell="rnn")
    with pytest.raises(ValueError, match="attention must be one of"):
        RNNConfig(vocab=5, attention="multiplicative")
    with pytest.raises(ValueError, match="hidden must be even"):
        RNNConfig(vocab=5, hidden=7)
    with pytest.raises(ValueError, match="padded on the right"):
        model().encode(torch.tensor([[0, 3, 2]]))
    with pytest.raises(ValueError, match="src must be integer token ids"):
        model().encode(torch.zeros(2, 3))


@pytest.mark.parametrize("attention", ["additive", "dot"])
def test_a_short_run_learns_to_copy(attention):
    """60 Adam steps on copy (length 3-5, 5 symbols): the loss falls to under half."""
    torch.manual_seed(0)
    task = Task("copy", min_len=3, max_len=5, num_symbols=5)
    m = RNNSeq2Seq(RNNConfig(vocab=len(task.vocab), attention=attention, hidden=32, embed_dim=16))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    rng = random.Random(0)
    losses = []
    for _ in range(60):
        src, tgt = make_batch(task, rng, 32)
        loss = m.loss(src, tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, (first, last)
