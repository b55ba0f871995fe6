"""The behaviours PyTorch's own tests check on `nn.MultiheadAttention` (test/nn/
test_multihead_attention.py) and SDPA (test/test_transformers.py, CPU), checked on attnkit's
drop-ins (issue 38, item 4). Numeric parity over every option is in test_multihead.py and
test_functional.py; this file adds what those tests check beyond numbers: exception classes,
dtypes, TorchScript and tracing, masks of both kinds at once, gradcheck, strides, -inf.

Two differences are deliberate and named where they show: a query row that may attend to
no key gives 0 (torch: NaN), and dropout draws from attnkit's own random stream (the same
seed drops other positions than torch's; the statistics are torch's)."""

from __future__ import annotations

import io

import pytest
import torch

from attnkit.nn import MultiheadAttention
from attnkit.nn.functional import scaled_dot_product_attention as sdpa

F64 = torch.float64


def _pair(*args, **kw):
    """(attnkit's module, torch's) with the same weights."""
    torch.manual_seed(0)
    ours = MultiheadAttention(*args, **kw)
    theirs = torch.nn.MultiheadAttention(*args, **kw)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


# --- nn.MultiheadAttention ---------------------------------------------------------------


def test_3d_attn_mask_equals_one_2d_mask_per_batch_item():  # test_multihead_attn_3d_attn_mask
    b, h, n, s, e = 8, 4, 2, 3, 8
    mha, _ = _pair(e, h)
    q, k = torch.rand(b, n, e), torch.rand(b, s, e)
    mask = torch.zeros(b, n, s).masked_fill(torch.rand(b, n, s) < 0.4, float("-inf"))
    mask[..., 0] = 0.0  # every row sees key 0 (torch would give NaN otherwise)
    out3 = mha(q.transpose(0, 1), k.transpose(0, 1), k.transpose(0, 1),
               attn_mask=mask.repeat_interleave(h, 0))[0].transpose(0, 1)  # fmt: skip
    for i in range(b):
        one = mha(q[i, :, None], k[i, :, None], k[i, :, None], attn_mask=mask[i])[0]
        torch.testing.assert_close(out3[i], one[:, 0])


def test_no_bias_and_separate_projections():  # ..._no_bias, _in_proj_bias_none, _weight_none
    mha = MultiheadAttention(8, 4, bias=False, dtype=F64)
    assert mha.in_proj_bias is None and mha.out_proj.bias is None
    x = torch.rand(2, 2, 8, dtype=F64)
    assert mha(x, x, x)[0].shape == (2, 2, 8)
    ours, theirs = _pair(4, 4, kdim=2, vdim=2, dtype=F64)
    assert ours.in_proj_weight is None
    q, k = torch.rand(4, 4, 4, dtype=F64), torch.rand(4, 4, 2, dtype=F64)
    torch.testing.assert_close(ours(q, k, k)[0], theirs(q, k, k)[0])


ASSERTION_CASES = {  # test_multihead_attn_invalid_shape (batched and unbatched)
    "key 2-D": ((4, 4, 4), (4, 4), (4, 4, 4), {}),
    "value 2-D": ((4, 4, 4), (4, 4, 4), (4, 4), {}),
    "1-D key_padding_mask": ((4, 4, 4), (4, 4, 4), (4, 4, 4), {"key_padding_mask": (4,)}),
    "1-D attn_mask": ((4, 4, 4), (4, 4, 4), (4, 4, 4), {"attn_mask": (4,)}),
    "unbatched, key 3-D": ((4, 4), (4, 4, 4), (4, 4), {}),
    "unbatched, 2-D key_padding_mask": ((4, 4), (4, 4), (4, 4), {"key_padding_mask": (1, 8)}),
    "query width": ((4, 4, 5), (4, 4, 5), (4, 4, 5), {}),
}


@pytest.mark.parametrize("case", sorted(ASSERTION_CASES))
def test_bad_shapes_raise_torchs_assertion_error_with_attnkits_message(case):
    q, k, v, masks = ASSERTION_CASES[case]
    args = [torch.randn(*shape) for shape in (q, k, v)]
    kw = {name: torch.zeros(shape, dtype=torch.bool) for name, shape in masks.items()}
    with pytest.raises(AssertionError) as theirs:
        torch.nn.MultiheadAttention(4, 4)(*args, **kw)
    with pytest.raises(AssertionError) as ours:
        MultiheadAttention(4, 4)(*args, **kw)
    assert isinstance(ours.value, ValueError)  # attnkit's class too
    name = next(iter(masks), "query" if case == "query width" else "key")
    assert name in str(ours.value) or "key and value" in str(ours.value), (ours, theirs)


@pytest.mark.parametrize(
    "kw",
    [{"attn_mask": torch.zeros(3, 5, dtype=torch.bool)}, {"is_causal": True}],
    ids=["2-D attn_mask of other sizes", "is_causal without attn_mask"],
)
def test_mask_errors_raise_torchs_runtime_error(kw):
    x = torch.randn(4, 2, 8)
    with pytest.raises(RuntimeError):
        torch.nn.MultiheadAttention(8, 2)(x, x, x, **kw)
    with pytest.raises(RuntimeError, match="attn_mask") as ours:
        MultiheadAttention(8, 2)(x, x, x, **kw)
    assert isinstance(ours.value, ValueError)


def test_inputs_of_another_dtype_than_the_weights_name_both():
    x = torch.randn(4, 2, 8)  # float32 into a float64 module: torch's matmul RuntimeError
    with pytest.raises(RuntimeError, match=r"query has dtype torch.float32, the module's weig"):
        MultiheadAttention(8, 2, dtype=F64)(x, x, x)


@pytest.mark.parametrize("grad", [False, True])
def test_a_half_in_proj_bias_with_a_double_query_runs_as_in_torch(grad):
    # test_multihead_attn_fast_path_query_and_bias_have_different_dtypes
    ours, theirs = _pair(4, 4, batch_first=True, dtype=F64)
    for m in (ours, theirs):
        m.eval().in_proj_bias = torch.nn.Parameter(m.in_proj_bias.detach().half())
    q = torch.randn(4, 4, 4, dtype=F64)
    with torch.set_grad_enabled(grad):
        got, want = ours(q, q, q)[0], theirs(q, q, q)[0]
    assert got.dtype == F64
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.bfloat16])
@pytest.mark.parametrize("batch_first", [False, True])
def test_output_keeps_the_dtype(dtype, batch_first):  # test_multihead_attention_dtype*
    mha = MultiheadAttention(16, 4, batch_first=batch_first).to(dtype)
    x = torch.randn(3, 5, 16, dtype=dtype)
    for need_weights in (True, False):
        out, _ = mha(x, x, x, need_weights=need_weights)
        assert out.dtype == dtype and out.shape == x.shape


def test_both_masks_at_once_equal_torch_apart_from_rows_that_see_nothing():
    # test_multihead_self_attn_two_masks_fast_path; difference 1: 0 (out_proj.bias), not NaN
    torch.manual_seed(1)
    ours, theirs = _pair(14, 7, batch_first=True)
    ours.eval(), theirs.eval()
    x = torch.rand(8, 5, 14)
    attn = torch.rand(5, 5) < 0.5
    kpm = torch.rand(8, 5) < 0.5
    kpm[0] = True  # batch row 0 sees no key at all
    with torch.no_grad():
        got = ours(x, x, x, attn_mask=attn, key_padding_mask=kpm)[0]
        want = theirs(x, x, x, attn_mask=attn, key_padding_mask=kpm)[0]
    blind = (attn[None] | kpm[:, None]).all(-1)  # (B, L): rows that see nothing
    assert bool(blind.any())
    torch.testing.assert_close(got[~blind], want[~blind])
    assert torch.equal(got[blind], ours.out_proj.bias.expand_as(got[blind]))
    assert bool(want[blind].isnan().all())


def _model(mha: torch.nn.Module) -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    layer.self_attn = mha
    return layer.eval()


def test_torchscript_scripts_the_module_and_a_model_holding_it():
    ours, theirs = _pair(8, 2, kdim=6, vdim=5, add_bias_kv=True)
    q, k, v = torch.randn(4, 3, 8), torch.randn(7, 3, 6), torch.randn(7, 3, 5)
    scripted = torch.jit.script(ours)
    for got in (scripted(q, k, v), theirs(q, k, v)):
        torch.testing.assert_close(got[0], ours(q, k, v)[0])
        torch.testing.assert_close(got[1], ours(q, k, v)[1])
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)  # TorchScript that saves: no Python left in it
    buffer.seek(0)
    torch.testing.assert_close(torch.jit.load(buffer)(q, k, v)[0], ours(q, k, v)[0])
    torch.manual_seed(0)
    model = _model(MultiheadAttention(8, 2, dropout=0.0))
    x = torch.randn(5, 3, 8)
    torch.testing.assert_close(torch.jit.script(model)(x), model(x))


def test_tracing_records_attnkits_computation():
    torch.manual_seed(0)
    model = _model(MultiheadAttention(8, 2, dropout=0.0))
    x = torch.randn(5, 3, 8)
    with pytest.warns(torch.jit.TracerWarning):  # shape checks are Python bools
        traced = torch.jit.trace(model, (x,))
    y = torch.randn(5, 3, 8)
    torch.testing.assert_close(traced(y), model(y))


# --- scaled_dot_product_attention -----------------------------------------------------------


def _qkv(*shape, dtype=F64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=g, dtype=dtype) for _ in range(3)]


SDPA_CASES = {  # test_invalid_inputs_* and friends: torch raises RuntimeError for each
    "dtypes differ": (lambda q, k, v: (q, k.float(), v), {}, "dtype"),
    "head widths differ": (lambda q, k, v: (q, k[..., :3], v), {}, ""),
    "mask does not broadcast": (
        lambda q, k, v: (q, k, v), {"attn_mask": torch.ones(3, 5, dtype=torch.bool)}, "attn_mask"),
    "batches differ": (lambda q, k, v: (q, k[:1].expand(3, -1, -1, -1)[:, :, :, :], v), {}, ""),
    "key heads do not divide": (lambda q, k, v: (q, k[:, :1].expand(-1, 3, -1, -1), v), {}, ""),
}  # fmt: skip


class _SdpaBlock(torch.nn.Module):
    """A user's attention block calling attnkit's SDPA drop-in (GQA: 4 query heads, 2 kv)."""

    def __init__(self, e: int = 12, heads: int = 4, kv_heads: int = 2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, e // heads
        self.q = torch.nn.Linear(e, e, dtype=F64)
        self.kv = torch.nn.Linear(e, 2 * kv_heads * self.d, dtype=F64)

    def forward(self, x: torch.Tensor, mem: torch.Tensor, mask: torch.Tensor | None,
                causal: bool) -> torch.Tensor:  # fmt: skip
        b, n, s = x.shape[0], x.shape[1], mem.shape[1]
        q = self.q(x).view(b, n, self.heads, self.d).transpose(1, 2)  # (B, H, L, d)
        kv = self.kv(mem).view(b, s, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]  # (B, Hkv, S, d) each
        o = sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=0.3, enable_gqa=True)
        return o.transpose(1, 2).reshape(b, n, self.heads * self.d)  # (B, L, E)


@pytest.mark.parametrize("kind", ["none", "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_torchscript_scripts_a_module_calling_the_sdpa_drop_in(kind, causal):
    torch.manual_seed(0)
    block = _SdpaBlock()
    x, mem = torch.randn(2, 5, 12, dtype=F64), torch.randn(2, 7, 12, dtype=F64)
    mask = torch.rand(5, 7) < 0.6
    mask[:, 0] = True  # every row sees a key (torch's math path gives NaN rows otherwise)
    if kind == "float":
        mask = torch.zeros(5, 7, dtype=F64).masked_fill(~mask, float("-inf"))
    mask = None if kind == "none" else mask
    scripted = torch.jit.script(block)
    want = block(x, mem, mask, causal)  # attnkit's computation; is_causal top-left (L != S)
    torch.testing.assert_close(scripted(x, mem, mask, causal), want, rtol=1e-12, atol=1e-12)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)  # TorchScript that saves: no Python left in it
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    torch.testing.assert_close(loaded(x, mem, mask, causal), want, rtol=1e-12, atol=1e-12)


def test_torchscript_scripts_the_sdpa_drop_in_itself():
    q, k, v = _qkv(2, 3, 6, 4)
    scripted = torch.jit.script(sdpa)
    got = scripted(q, k[:, :, :4], v[:, :, :4], is_causal=True, scale=0.5)
    torch.testing.assert_close(got, sdpa(q, k[:, :, :4], v[:, :, :4], is_causal=True, scale=0.5))


@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_sdpa_bad_input_raises_torchs_runtime_error(case):
    make, kw, word = SDPA_CASES[case]
    args = make(*_qkv(2, 2, 5, 4))
    with pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(*args, **kw)
    with pytest.raises(RuntimeError, match=word) as ours:
        sdpa(*args, **kw)
    assert isinstance(ours.value, ValueError)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize(("n", "s"), [(5, 5), (3, 6), (6, 3)])
def test_sdpa_attn_mask_and_is_causal_together_equal_torch(kind, n, s):
    # torch 2.13's CPU SDPA applies both (earlier versions refused the pair)
    q, k, v = _qkv(2, 2, max(n, s), 4)
    q, k, v = q[:, :, :n], k[:, :, :s], v[:, :, :s]
    mask = torch.rand(n, s, generator=torch.Generator().manual_seed(1)) < 0.7
    mask[:, 0] = True
    if kind == "float":
        mask = torch.zeros(n, s, dtype=F64).masked_fill(~mask, float("-inf"))
    got = sdpa(q, k, v, attn_mask=mask, is_causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    torch.testing.assert_close(got, want)


def test_sdpa_gradcheck():  # test_sdp_math_gradcheck
    q, k, v = (t[:, :, :3].requires_grad_() for t in _qkv(1, 2, 4, 3))
    mask = torch.rand(3, 3) < 0.7
    mask[:, 0] = True
    assert torch.autograd.gradcheck(lambda a, b, c: sdpa(a, b, c, attn_mask=mask), (q, k, v))


def test_sdpa_non_contiguous_inputs():  # test_non_contiguous / strided inputs
    q, k, v = _qkv(2, 5, 3, 4)  # (B, L, H, E), read as (B, H, L, E) through a transpose
    got = sdpa(*(t.transpose(1, 2) for t in (q, k, v)))
    want = sdpa(*(t.transpose(1, 2).contiguous() for t in (q, k, v)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_sdpa_with_inf_in_a_float_mask():  # test_sdpa_with_inf; difference 1 for -inf rows
    q, k, v = _qkv(1, 1, 4, 8)
    bias = torch.zeros(4, 4)
    bias[0, 1:] = float("-inf")  # row 0 sees key 0 only
    bias[3] = float("-inf")  # row 3 sees nothing: attnkit 0, torch NaN (math) or 0 (fused)
    got = sdpa(q, k, v, attn_mask=bias)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(got[..., :3, :], want[..., :3, :])
    torch.testing.assert_close(got[..., 0, :], v[..., 0, :])
    assert torch.equal(got[..., 3, :], torch.zeros_like(got[..., 3, :]))


def test_dropout_has_torchs_statistics_from_another_stream():
    # difference 2: the same seed drops other positions than torch's
    s, p = 64, 0.3
    q = torch.zeros(1, 1, 256, 4, dtype=F64)  # equal scores: every probability is 1 / S
    k = torch.zeros(1, 1, s, 4, dtype=F64)
    v = torch.eye(s, dtype=F64)[None, None]  # out = the dropped probabilities themselves
    torch.manual_seed(0)
    ours = sdpa(q, k, v, dropout_p=p)
    torch.manual_seed(0)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)
    kept = ours != 0
    assert abs(float(kept.double().mean()) - (1 - p)) < 0.02  # 16384 draws: ~5 sigma
    torch.testing.assert_close(ours[kept], torch.full_like(ours[kept], 1 / s / (1 - p)))
    assert not torch.equal(kept, theirs != 0)
