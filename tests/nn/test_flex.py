"""attnkit.nn.attention.flex_attention against FlexAttention's meaning: attention-gym style
mask_mods and score_mods, forward, lse and gradients against a float64 reference built from
torch's own `create_mask`, against torch's FlexAttention (uncompiled, and compiled on the CPU,
forward only: it has no CPU backward), GQA, the signature, errors, and a Flex training loop
that runs a backward with only its import changed."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex

import attnkit
import attnkit.nn.attention.flex_attention as ak_flex
from attnkit.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

F64 = torch.float64
B, H, N = 2, 4, 97  # N not a multiple of the block size
BLOCK = 32


# --------------------------------------------------------------------------- attention-gym zoo


def _doc_ids(n):
    lengths = [n // 3, n // 4, n - n // 3 - n // 4]
    return torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))


def _masks(n):
    """name -> mask_mod, written as attention-gym writes them."""
    doc = _doc_ids(n)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx <= 16) & (q_idx >= kv_idx)

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx <= 20) | (q_idx >= kv_idx)

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def dilated(b, h, q_idx, kv_idx):
        return ((q_idx - kv_idx).abs() < 24) & ((q_idx - kv_idx) % 3 == 0)

    def per_head(b, h, q_idx, kv_idx):  # depends on the batch row and the head
        return (q_idx >= kv_idx) | ((h == 1) & (b == 0))

    return {f.__name__: f for f in (causal, sliding_window, prefix_lm, document, dilated, per_head)}


def _score_mods(dtype=F64):
    """name -> (score_mod, tensors it closes over that get gradients)."""
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, dtype=dtype) / H)
    table = torch.randn(H, 2 * 31 + 1, dtype=dtype, generator=torch.Generator().manual_seed(3))
    table.requires_grad_()

    def relative_positional(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) / 16

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def softcap(score, b, h, q_idx, kv_idx):
        return 2.0 * torch.tanh(score / 2.0)

    def learned_table(score, b, h, q_idx, kv_idx):
        return score + table[h, (q_idx - kv_idx).clamp(-31, 31) + 31]

    return {
        "relative_positional": (relative_positional, []),
        "alibi": (alibi, []),
        "softcap": (softcap, []),
        "learned_table": (learned_table, [table]),
    }


def _inputs(n=N, s=N, hkv=H, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, 16, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, hkv, s, 16, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, hkv, s, 12, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _naive(q, k, v, allowed, score_mod=None, scale=None):
    """softmax(mask(score_mod(scale·q·kᵀ)))·v and lse on the whole (B, H, N, S) matrix."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ kk.transpose(-2, -1) * scale  # (B, H, N, S)
    b, h, n, m = s.shape
    if score_mod is not None:
        ar = torch.arange
        s = score_mod(s, ar(b).view(b, 1, 1, 1), ar(h).view(1, h, 1, 1), ar(n).view(n, 1), ar(m))
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    dead = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return p @ vv, torch.logsumexp(s, -1)


def _block_mask(mask_mod, n=N, s=N, batch=None, heads=None):
    return create_block_mask(mask_mod, batch, heads, n, s, device="cpu", BLOCK_SIZE=BLOCK)


# --------------------------------------------------------------------------- meaning


def test_signature_is_torchs():
    ours = inspect.signature(flex_attention).parameters
    theirs = inspect.signature(torch_flex.flex_attention).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]
    assert attnkit.flex_attention is flex_attention is attnkit.nn.flex_attention
    assert ak_flex.create_block_mask is torch_flex.create_block_mask


@pytest.mark.parametrize("mask_name", list(_masks(N)))
@pytest.mark.parametrize("mod_name", [None, *_score_mods()])
def test_zoo_equals_reference_forward_lse_and_gradients(mask_name, mod_name):
    mask_mod = _masks(N)[mask_name]
    score_mod, tables = _score_mods()[mod_name] if mod_name else (None, [])
    heads = H if mask_name == "per_head" else None
    batch = B if mask_name == "per_head" else None
    bm = _block_mask(mask_mod, batch=batch, heads=heads)
    allowed = torch_flex.create_mask(mask_mod, batch or 1, heads or 1, N, N, device="cpu")
    q, k, v = _inputs()
    out, lse = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=True)
    ref, ref_lse = _naive(q, k, v, allowed, score_mod)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(lse, ref_lse.detach(), atol=1e-10, rtol=1e-10)
    dout = torch.randn_like(out)
    leaves = [q, k, v, *tables]
    got = torch.autograd.grad(out, leaves, dout)
    want = torch.autograd.grad(ref, leaves, dout)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


def test_gqa_scale_and_n_not_s():
    """enable_gqa with Hkv = 2, a chosen scale, and L != S (Flex's indices are raw)."""
    n, s = 61, N

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + (s - n)

    score_mod, _ = _score_mods()["alibi"]
    bm = _block_mask(mask_mod, n, s)
    q, k, v = _inputs(n, s, hkv=2)
    out = flex_attention(q, k, v, score_mod, bm, scale=0.3, enable_gqa=True)
    allowed = torch_flex.create_mask(mask_mod, 1, 1, n, s, device="cpu")
    torch.testing.assert_close(out, _naive(q, k, v, allowed, score_mod, 0.3)[0], atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flex_attention(q, k, v, block_mask=bm)


def test_no_block_mask_and_return_aux():
    q, k, v = _inputs()
    out, aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=True))
    ref, ref_lse = _naive(q, k, v, None)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(aux.lse, ref_lse.detach(), atol=1e-10, rtol=0)
    assert aux.max_scores is None
    assert isinstance(flex_attention(q, k, v, kernel_options={"BLOCK_M": 64}), torch.Tensor)
    with pytest.raises(NotImplementedError, match="max_scores"):
        flex_attention(q, k, v, return_aux=AuxRequest(max_scores=True))
    with pytest.raises(ValueError, match="return_lse and return_aux"):
        flex_attention(q, k, v, return_lse=True, return_aux=AuxRequest(lse=True))


def test_score_mod_written_for_per_element_calls_works_with_gradients():
    """Vectorised, stack().min() would reduce the whole block without an error: detected on
    the first block and called per element, the table still gets its gradient."""
    table = torch.randn(9, dtype=F64, requires_grad=True)

    def per_element(score, b, h, q_idx, kv_idx):
        return score + table[torch.stack([q_idx, kv_idx]).min() % 9]

    def vectorised(score, b, h, q_idx, kv_idx):
        return score + table[torch.minimum(q_idx, kv_idx) % 9]

    bm = _block_mask(_masks(N)["sliding_window"])
    allowed = torch_flex.create_mask(_masks(N)["sliding_window"], 1, 1, N, N, device="cpu")
    q, k, v = _inputs()
    got = flex_attention(q, k, v, per_element, bm)
    want = _naive(q, k, v, allowed, vectorised)[0]
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    dout = torch.randn_like(got)
    g = torch.autograd.grad(got, (q, table), dout)
    w = torch.autograd.grad(want, (q, table), dout)
    for a, b in zip(g, w, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_score_mod_that_cannot_be_evaluated_names_vectorisation():
    def python_if(score, b, h, q_idx, kv_idx):
        return score if q_idx > 3 else -score

    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"vectorised.*torch\.vmap.*tensor operations"):
        flex_attention(q, k, v, python_if)


def test_fully_masked_rows_give_zero_and_minus_inf():
    def none_for_odd(b, h, q_idx, kv_idx):
        return (q_idx % 2 == 0) & (kv_idx <= q_idx)

    q, k, v = _inputs()
    out, lse = flex_attention(q, k, v, block_mask=_block_mask(none_for_odd), return_lse=True)
    (gq,) = torch.autograd.grad(out.sum(), q)
    assert (out[:, :, 1::2] == 0).all() and torch.isneginf(lse[:, :, 1::2]).all()
    assert torch.isfinite(gq).all() and (gq[:, :, 1::2] == 0).all()


def test_errors_name_what_is_wrong():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"created for \(L, S\) = \(64, 64\)"):
        flex_attention(q, k, v, block_mask=_block_mask(_masks(64)["causal"], 64, 64))
    with pytest.raises(ValueError, match="4-D") as err:
        flex_attention(q[0], k[0], v[0])
    assert isinstance(err.value, NotImplementedError)  # what FlexAttention raises there
    with pytest.raises(RuntimeError, match="sliced BlockMask"):
        flex_attention(q, k, v, block_mask=_block_mask(_masks(N)["causal"], batch=B)[0])


# --------------------------------------------------------------------------- against FlexAttention


def test_equals_torch_flex_uncompiled_forward():
    """torch's uncompiled fallback (forward; it warns that it is slow)."""
    q, k, v = (t.detach() for t in _inputs())
    bm = _block_mask(_masks(N)["document"])
    score_mod, _ = _score_mods()["softcap"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want, want_lse = torch_flex.flex_attention(q, k, v, score_mod, bm, return_lse=True)
    got, lse = flex_attention(q, k, v, score_mod, bm, return_lse=True)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    torch.testing.assert_close(lse, want_lse.to(lse.dtype), atol=1e-10, rtol=0)


@pytest.mark.slow
def test_equals_torch_flex_compiled_cpu_forward():
    """The kernels FlexAttention users run (torch.compile; CPU: forward, float32): a document
    mask and ALiBi, both indexing captured tensors (~15 s of compiling)."""
    q, k, v = (t.detach().float() for t in _inputs(n=128, s=128, hkv=2))
    bm = _block_mask(_masks(128)["document"], 128, 128)
    score_mod, _ = _score_mods(torch.float32)["alibi"]
    compiled = torch.compile(torch_flex.flex_attention, fullgraph=True)
    want = compiled(q, k, v, score_mod, bm, enable_gqa=True)
    got = flex_attention(q, k, v, score_mod, bm, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


# --------------------------------------------------------------------------- training


def _flex_training_script(flex_module, steps=4):
    """A FlexAttention training loop, written against `flex_module` as a script imports it."""
    flex_attention, create_block_mask = flex_module.flex_attention, flex_module.create_block_mask
    torch.manual_seed(0)
    n, c, heads = 64, 32, 4
    qkv, proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
    opt = torch.optim.SGD([*qkv.parameters(), *proj.parameters()], lr=0.5)
    x, y = torch.randn(2, n, c), torch.randn(2, n, c)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def softcap(score, b, h, q_idx, kv_idx):
        return 30 * torch.tanh(score / 30)

    block_mask = create_block_mask(causal, None, None, n, n, device="cpu", BLOCK_SIZE=32)
    losses = []
    for _ in range(steps):
        q, k, v = qkv(x).view(2, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4)  # (B, H, N, D)
        out = flex_attention(q, k, v, score_mod=softcap, block_mask=block_mask)
        loss = torch.nn.functional.mse_loss(proj(out.transpose(1, 2).reshape(2, n, c)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_under_torch_compile_it_runs_eagerly_with_a_backward():
    """A script that compiles flex_attention (FlexAttention's habit) gets attnkit's eager call
    inside the compiled code (a graph break): the same numbers and gradients, bit for bit."""
    q, k, v = _inputs(dtype=torch.float32)
    bm = _block_mask(_masks(N)["document"])
    score_mod, _ = _score_mods(torch.float32)["softcap"]
    compiled = torch.compile(flex_attention, backend="aot_eager")
    got = compiled(q, k, v, score_mod, bm)
    want = flex_attention(q, k, v, score_mod, bm)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    (g,) = torch.autograd.grad(got.sum(), q)
    (w,) = torch.autograd.grad(want.sum(), q)
    torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_flex_training_script_trains_with_only_the_import_changed():
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        _flex_training_script(torch_flex)  # torch's FlexAttention on the CPU
    losses = _flex_training_script(ak_flex)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
