"""The one-new-token decode step of `CachedMultiHeadAttention` (`_decode_one`) computes what the
general path computes, and `attention_without_checks` what `attention` computes."""

from __future__ import annotations

import pytest
import torch

from attnkit import attention, use_backend
from attnkit.functional.attention import attention_without_checks
from attnkit.models import KVCache
from attnkit.models.decoding import CachedMultiHeadAttention
from attnkit.modules import RotaryEmbedding
from attnkit.viz.record import record_attention
from tests.naive import naive_attention

CASES = {
    "mha": {},
    "gqa": {"num_kv_heads": 2},
    "mqa-dv": {"num_kv_heads": 1, "v_head_dim": 12},
    "rotary": {"rotary": RotaryEmbedding(8)},
}


def _steps(mha, x, force_general: bool) -> torch.Tensor:
    """Prefill x[:, :5], then one token at a time; the output of every step, (B, T, Co)."""
    cache = KVCache(capacity=x.shape[1])
    handle = None
    if force_general:  # a hook on Attend sends the step through the general path
        handle = mha.attend.register_forward_hook(lambda *a: None)
    outs = [mha(x[:, :5], causal=True, cache=cache)]
    for t in range(5, x.shape[1]):
        outs.append(mha(x[:, t : t + 1], causal=True, cache=cache))
    if handle is not None:
        handle.remove()
    return torch.cat(outs, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_decode_step_equals_general_path_and_full_forward(case, dtype):
    torch.manual_seed(0)
    mha = CachedMultiHeadAttention(32, 4, dtype=dtype, **CASES[case]).eval()
    x = torch.randn(3, 11, 32, dtype=dtype)
    with torch.no_grad():
        fast = _steps(mha, x, force_general=False)
        general = _steps(mha, x, force_general=True)
        full = mha(x, causal=True)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(fast, general, atol=tol, rtol=0)
    torch.testing.assert_close(fast, full, atol=tol, rtol=0)


def test_decode_step_is_taken_and_yields_to_recording():
    """Without watchers Attend is not called (the fast step); while recording it is, and the
    recorded weights of a step are the probabilities over every cached key."""
    torch.manual_seed(1)
    mha = CachedMultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 6, 16)
    calls = []
    original = mha.attend.forward
    mha.attend.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    cache = KVCache()
    with torch.no_grad():
        mha(x[:, :5], causal=True, cache=cache)
        calls.clear()
        mha(x[:, 5:], causal=True, cache=cache)
        assert calls == []  # fast step: Attend.forward not called
        cache = KVCache()
        mha(x[:, :5], causal=True, cache=cache)
        with record_attention(mha) as rec:
            mha(x[:, 5:], causal=True, cache=cache)
    (weights,) = rec.layers()  # (B, H, 1, S): the one new query over all 6 keys
    assert weights.shape == (1, 2, 1, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


def test_dropout_in_training_takes_the_general_path():
    mha = CachedMultiHeadAttention(16, 2, dropout=0.5).train()
    x = torch.randn(1, 6, 16)
    cache = KVCache()
    mha(x[:, :5], causal=True, cache=cache)
    torch.manual_seed(0)
    a = mha(x[:, 5:], causal=True, cache=KVCache())  # fresh cache: no keys but its own
    torch.manual_seed(0)
    b = mha(x[:, 5:], causal=True)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("n", [1, 3])
def test_attention_without_checks_equals_attention(kv_heads, n):
    torch.manual_seed(2)
    q = torch.randn(2, 4, n, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, kv_heads, 9, 8, dtype=torch.float64).unbind(0)
    q[1, 2, 0, 3] = float("nan")  # rule 1: that row (and only it) is NaN
    got = attention_without_checks(q, k, v, scale=0.3)
    torch.testing.assert_close(got, attention(q, k, v, scale=0.3).out, equal_nan=True)
    want, _ = naive_attention(q, k, v, scale=0.3)  # (B, H, N, Dv) float64, kv heads repeated
    assert torch.isnan(got[1, 2, 0]).all() and not torch.isnan(got[0]).any()
    torch.testing.assert_close(got[0], want[0], atol=1e-12, rtol=0)


def test_attention_without_checks_declines_other_backends():
    q, k, v = torch.randn(3, 1, 2, 4, 8).unbind(0)
    assert attention_without_checks(q, k, v, backend="chunked") is None
    assert attention_without_checks(q, k, v, backend="reference") is None
    assert attention_without_checks(q, k[:, :, :0], v[:, :, :0]) is None  # no key: `_no_work`
    with use_backend("chunked"):
        assert attention_without_checks(q, k, v) is None
        assert attention_without_checks(q, k, v, backend="fused") is not None


def test_attention_without_checks_keeps_rule_one_in_float32():
    """SDPA's CPU flash kernel (float32) gives a NaN query row 0; rule 1 says NaN."""
    q = torch.randn(2, 4, 1, 8)
    k, v = torch.randn(2, 2, 4, 7, 8).unbind(0)
    q[1, 3, 0, 0] = float("nan")
    got = attention_without_checks(q, k, v)
    assert torch.isnan(got[1, 3]).all()
    assert torch.isfinite(got[0]).all() and torch.isfinite(got[1, :3]).all()
