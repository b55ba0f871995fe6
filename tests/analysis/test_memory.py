"""Saved-for-backward bytes against a measurement with `saved_tensors_hooks`."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import attention
from attnkit.analysis import attention_memory, score_matrix_bytes
from attnkit.functional import native

pytestmark = pytest.mark.threads(1)


def saved_bytes(fn, *args) -> int:
    """Bytes of the distinct storages autograd saves while `fn(*args)` runs.

    Exact: every tensor kept for backward goes through the pack hook; a storage
    saved twice (softmax and the next matmul both keep the probabilities, k is
    saved as its transposed view) is counted once.
    """
    storages: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(storages.values())


def plain_attention(q, k, v, dropout_p=0.0):
    """Textbook attention, GQA by repeating k and v (what attnkit's reference does)."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # (B, H, S, D)
    v = v.repeat_interleave(groups, dim=1)  # (B, H, S, Dv)
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, N, S)
    probs = torch.softmax(scores, dim=-1)
    if dropout_p:
        probs = F.dropout(probs, dropout_p)
    return torch.matmul(probs, v)  # (B, H, N, Dv)


def sdpa(q, k, v, dropout_p=0.0):
    return F.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, enable_gqa=k.shape[1] != q.shape[1]
    )


def chunked_call(q, k, v, dropout_p=0.0):
    return attention(q, k, v, dropout_p=dropout_p, training=True, backend="chunked").out


def _qkv(b, h, hkv, n, s, d, dv, dtype):
    g = torch.Generator().manual_seed(0)
    shapes = ((b, h, n, d), (b, hkv, s, d), (b, hkv, s, dv))
    return [torch.randn(*sh, generator=g, dtype=dtype).requires_grad_() for sh in shapes]


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3), h=st.sampled_from([1, 2, 3, 6]), n=st.integers(1, 19),
    s=st.integers(1, 23), d=st.sampled_from([1, 5, 8]), dv=st.sampled_from([3, 8]),
    gqa=st.booleans(), dropout=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)  # fmt: skip
def test_saved_bytes_match_measurement(b, h, n, s, d, dv, gqa, dropout, dtype):
    hkv = 1 if gqa else h
    q, k, v = _qkv(b, h, hkv, n, s, d, dv, dtype)
    p = 0.5 if dropout else 0.0
    kw = {"kv_heads": hkv, "v_dim": dv, "dtype": dtype, "dropout": dropout}
    ref = attention_memory(b, h, n, s, d, backend="reference", **kw)
    assert saved_bytes(plain_attention, q, k, v, p) == ref.saved_bytes
    fused = attention_memory(b, h, n, s, d, backend="fused", **kw)
    assert saved_bytes(sdpa, q, k, v, p) == fused.saved_bytes
    if dtype == torch.bfloat16 and not native.available():
        return  # the PyTorch kernel keeps bfloat16 q, k, v: the model describes the compiled one
    chunked = attention_memory(b, h, n, s, d, backend="chunked", **kw)
    assert saved_bytes(chunked_call, q, k, v, p) == chunked.saved_bytes


def test_reference_keeps_the_score_matrix_fused_does_not():
    b, h, n, d = 2, 4, 4096, 32
    e = score_matrix_bytes(b, h, n)
    assert e == b * h * n * n * 4
    ref = attention_memory(b, h, n, head_dim=d)
    fused = attention_memory(b, h, n, head_dim=d, backend="fused")
    chunked = attention_memory(b, h, n, head_dim=d, backend="chunked", dropout=True)
    assert ref.saved["probs"] == e and ref.saved_bytes > e
    assert fused.saved_bytes + 8 == chunked.saved_bytes < e // 10  # + the dropout seed
    assert ref.forward_peak >= 2 * e and fused.forward_peak < e // 10
    with_dropout = attention_memory(b, h, n, head_dim=d, dropout=True)
    assert with_dropout.saved_bytes == ref.saved_bytes + 2 * e
    # SDPA's CPU flash kernel has no dropout: with dropout it runs the math path
    assert attention_memory(b, h, n, head_dim=d, backend="fused", dropout=True) == with_dropout
    assert attention_memory(b, h, n, head_dim=d, dtype="float16").saved_bytes * 2 == ref.saved_bytes


@pytest.mark.parametrize(
    "kwargs,match",
    [({"backend": "flash"}, "backend"), ({"dtype": "float17"}, "dtype")],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention_memory(1, 1, 4, **kwargs)
