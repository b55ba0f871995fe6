"""Universal Transformer: the coordinate signal, ACT's halting weights and ponder cost against
a float64 hand computation, padding, cached decoding, gradients, a short training run."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from attnkit.models.decoding import KVCache, beam_search, greedy
from attnkit.models.universal import (
    UniversalConfig,
    UniversalTransformer,
    adaptive_computation,
    coordinate_signal,
)
from attnkit.seq2seq.tasks import Task, make_batch

V = 11
SRC = torch.tensor([[3, 4, 5, 6, 2], [7, 8, 2, 0, 0]])
TGT = torch.tensor([[1, 6, 5, 4], [1, 8, 7, 2]])


def model(act=False, steps=3, dtype=torch.float32, **kw) -> UniversalTransformer:
    torch.manual_seed(0)
    cfg = UniversalConfig(vocab=V, d_model=16, num_heads=2, d_ff=32, steps=steps, act=act, **kw)
    return UniversalTransformer(cfg, dtype=dtype).eval()


def test_coordinate_signal_is_position_plus_step_sinusoid():
    c, t = 6, 3
    got = coordinate_signal(t, 4, c, dtype=torch.float64)
    for i in range(4):
        for j in range(c // 2):
            freq = 10000 ** (-2 * j / c)
            assert got[i, 2 * j].item() == pytest.approx(
                math.sin(i * freq) + math.sin(t * freq), abs=1e-12
            )
            assert got[i, 2 * j + 1].item() == pytest.approx(
                math.cos(i * freq) + math.cos(t * freq), abs=1e-12
            )


def _act_by_hand(h: list[list[float]], states: list[list[float]], max_steps: int, thr: float):
    """Graves' ACT for one position, in Python floats: h[k] halting probabilities and
    states[k] (scalar) states of steps k = 0.. . Returns (weights, output, ponder, N)."""
    total, weights = 0.0, []
    for k in range(max_steps):
        if total + h[k] > thr or k == max_steps - 1:
            weights.append(1.0 - total)
            n, remainder = k + 1, 1.0 - total
            break
        weights.append(h[k])
        total += h[k]
    out = sum(w * s for w, s in zip(weights, states, strict=False))
    return weights, out, n + remainder, n


@pytest.mark.parametrize("threshold", [0.99, 0.6])
def test_act_weights_ponder_and_output_match_a_float64_hand_computation(threshold):
    g = torch.Generator().manual_seed(3)
    b, n, max_steps = 3, 5, 4
    probs = torch.rand(max_steps, b, n, generator=g, dtype=torch.float64) * 0.6  # h_k
    scale = torch.rand(max_steps, b, n, 1, generator=g, dtype=torch.float64) + 0.5
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[2, 3:] = False  # padding takes no weight and no ponder cost
    seen = []

    def transition(state, k):  # state_k = state_(k-1) · scale_k: a known sequence of states
        seen.append(k)
        return state * scale[k - 1]

    def halting(state):
        return probs[len(seen) - 1]

    x = torch.ones(b, n, 1, dtype=torch.float64)
    got = adaptive_computation(
        transition, halting, x, valid, max_steps=max_steps, threshold=threshold
    )
    states = torch.cumprod(scale[..., 0], dim=0)  # (K, B, N): state_k of each position
    for i in range(b):
        for j in range(n):
            if not valid[i, j]:
                assert got.weights[i, j].sum() == 0 and got.ponder[i, j] == 0
                assert got.halt_step[i, j] == 0 and got.state[i, j, 0] == 0
                continue
            w, out, ponder, steps = _act_by_hand(
                probs[:, i, j].tolist(), states[:, i, j].tolist(), max_steps, threshold
            )
            assert got.weights[i, j, : len(w)].tolist() == pytest.approx(w, abs=1e-15)
            assert (got.weights[i, j, len(w) :] == 0).all()
            assert got.weights[i, j].sum().item() == pytest.approx(1.0, abs=1e-15)
            assert got.ponder[i, j].item() == pytest.approx(ponder, abs=1e-15)
            assert got.halt_step[i, j].item() == steps <= max_steps
            assert got.state[i, j, 0].item() == pytest.approx(out, abs=1e-14)
    assert seen == list(range(1, got.weights.shape[-1] + 1))  # stopped once all halted


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_act_in_the_model_halting_sums_and_ponder_cost(steps):
    m = model(act=True, steps=steps, dtype=torch.float64)
    enc, dec = m.act_trace(SRC, TGT)
    real = SRC != 0
    torch.testing.assert_close(
        enc.weights.sum(-1)[real], torch.ones(int(real.sum()), dtype=torch.float64)
    )
    assert (enc.weights.sum(-1)[~real] == 0).all()
    assert ((enc.halt_step[real] >= 1) & (enc.halt_step[real] <= steps)).all()
    assert ((dec.halt_step >= 1) & (dec.halt_step <= steps)).all()  # TGT has no padding
    # ρ = N + R, and the reported cost is the mean over the real positions of each side
    remainder = enc.ponder - enc.halt_step
    assert ((remainder[real] > 0) & (remainder[real] <= 1)).all()
    want = enc.ponder[real].mean() + dec.ponder.mean()
    torch.testing.assert_close(m(SRC, TGT).ponder_cost, want)


def test_without_act_the_block_runs_exactly_t_times_and_costs_nothing():
    m = model(act=False, steps=3)
    calls = []
    m.encoder.register_forward_hook(lambda *a: calls.append("enc"))
    m.decoder.register_forward_hook(lambda *a: calls.append("dec"))
    out = m(SRC, TGT)
    assert calls == ["enc"] * 3 + ["dec"] * 3
    assert out.logits.shape == (2, 4, V) and out.ponder_cost.item() == 0


@pytest.mark.parametrize("act", [False, True])
def test_padding_never_changes_a_row(act):
    m = model(act=act, steps=4)
    both = m(SRC, TGT)
    alone = m(SRC[1:, :3], TGT[1:])
    torch.testing.assert_close(both.logits[1:], alone.logits, atol=1e-5, rtol=1e-5)
    wider = m(F.pad(SRC, (0, 2)), TGT)
    torch.testing.assert_close(wider.logits, both.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("act", [False, True])
def test_cached_decoding_equals_teacher_forcing(act):
    m = model(act=act, steps=3)
    memory, mask = m.encode(SRC)
    full = m.decode(TGT, memory, mask)
    cache = KVCache()
    steps = [m.decode(TGT[:, t : t + 1], memory, mask, cache=cache) for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    kw = {"bos": 1, "eos": 2, "pad": 0, "max_len": 6}
    assert torch.equal(beam_search(m, SRC, beam_size=1, **kw), greedy(m, SRC, **kw))


@pytest.mark.parametrize("act", [False, True])
def test_gradients_are_finite_and_act_trains_the_halting_units(act):
    m = model(act=act, steps=3).train()
    tgt = torch.cat([TGT, torch.tensor([[2], [0]])], dim=1)
    m.loss(SRC, tgt).backward()
    for name, p in m.named_parameters():
        if "_halt." in name and not act:
            assert p.grad is None, name  # unused without ACT
            continue
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    if act:
        assert m.encoder_halt.weight.grad.abs().sum() > 0


def test_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        UniversalConfig(vocab=5, steps=0)
    with pytest.raises(ValueError, match="act_threshold"):
        UniversalConfig(vocab=5, act_threshold=1.5)
    with pytest.raises(ValueError, match="divisible"):
        UniversalConfig(vocab=5, d_model=10, num_heads=4)
    with pytest.raises(ValueError, match="max_len"):
        model(max_len=4)(SRC, TGT)


def test_a_short_run_with_act_learns_to_copy():
    """60 Adam steps on copy (length 3-5): the loss (ponder cost included) falls below half."""
    torch.manual_seed(0)
    task = Task("copy", min_len=3, max_len=5, num_symbols=5)
    cfg = UniversalConfig(vocab=len(task.vocab), d_model=32, num_heads=2, d_ff=64, act=True)
    m = UniversalTransformer(cfg)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
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
