"""The compiled CPU kernel pinned to a float64 reference, to the PyTorch kernel, and to itself.

Legend: B batch, H heads, Hkv kv heads, N queries, S keys, D head width, Dv value width.

Tolerance rule (flash-attention's): the kernel's float32 error against the float64 truth is at
most twice that of a plain float32 matmul + softmax on the same inputs, plus a small floor.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from attnkit.functional import _kernel_cache, native
from attnkit.functional._dropout import (
    as_unsigned,
    draw_seed,
    dropout_keep_mask,
    keep_threshold,
    keep_words,
    row_ids,
)
from attnkit.functional.chunked import chunked_attention
from tests.functional.test_chunked import grads, naive

needs_kernel = pytest.mark.skipif(
    not native.available(),
    reason="compiled kernel unavailable (no C++ compiler, or ATTNKIT_NATIVE=0)",
)


def make(b, h, hkv, n, s, d, dv, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hkv, s, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hkv, s, dv, generator=gen, dtype=torch.float64)
    return q, k, v


def leaves(*ts, dtype=torch.float32):
    return [t.detach().to(dtype).requires_grad_() for t in ts]


def run(q, k, v, kernel="native", **kw):
    kw = {"mask": None, "bias": None, "causal": False, "scale": q.shape[-1] ** -0.5,
          "dropout_p": 0.0, "training": False, **kw}  # fmt: skip
    return chunked_attention(q, k, v, kernel=kernel, **kw)


def all_results(out, lse, inputs):
    return [out, lse.nan_to_num(neginf=0.0), *grads(out, lse, inputs)]


def check_against_truth(q64, k64, v64, *, keep=None, p=0.0, seed=None, factor=2.0, **kw):
    """Native float32 vs naive float64 truth, within `factor` (2) times the naive float32
    error (+ floor)."""
    ref_kw = {x: kw[x] for x in ("mask", "bias", "causal") if x in kw}
    ref_kw["scale"] = kw.get("scale", q64.shape[-1] ** -0.5)
    truth_in = leaves(q64, k64, v64, dtype=torch.float64)
    truth = all_results(*naive(*truth_in, keep=keep, p=p, **ref_kw), truth_in)
    naive_in = leaves(q64, k64, v64)
    ref32_kw = {**ref_kw, "bias": None if kw.get("bias") is None else kw["bias"].float()}
    plain = all_results(*naive(*naive_in, keep=keep, p=p, **ref32_kw), naive_in)
    ours_in = leaves(q64, k64, v64)
    if seed is not None:
        torch.manual_seed(seed)
    ours = all_results(*run(*ours_in, **{**kw, **({"bias": ref32_kw["bias"]})}), ours_in)
    out, lse = ours[0], ours[1]
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    names = ["out", "lse", "dq", "dk", "dv"]
    for name, got, want, base in zip(names, ours, truth, plain, strict=True):
        assert torch.isfinite(got).all(), name
        err = (got.double() - want).abs().max().item()
        naive_err = (base.double() - want).abs().max().item()
        assert err <= factor * naive_err + 2e-6, (
            f"{name}: error {err:.2e}, naive float32 {naive_err:.2e}"
        )
    return ours


SHAPES = [  # (B, H, Hkv, N, S, D, Dv)
    (1, 1, 1, 1, 1, 8, 8),
    (2, 4, 2, 7, 97, 24, 40),
    (1, 3, 1, 130, 600, 16, 24),  # MQA, several key blocks with a short last one
    (2, 2, 2, 300, 300, 64, 64),
    (1, 6, 3, 257, 1025, 80, 48),  # head width not a power of two, N < S
    (2, 2, 1, 300, 130, 16, 8),  # N > S: causal leaves the first 170 rows with no key
]


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_truth(shape, causal):
    check_against_truth(*make(*shape), causal=causal, scale=0.3)


@needs_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_masks_bias_and_rows_that_see_nothing(causal):
    b, h, hkv, n, s = 2, 4, 2, 70, 90
    q, k, v = make(b, h, hkv, n, s, 32, 16, seed=1)
    gen = torch.Generator().manual_seed(2)
    mask = torch.rand(b, 1, n, s, generator=gen) > 0.4  # (B, 1, N, S): heads broadcast
    mask[0, 0, 5] = False  # a row that sees nothing
    bias = torch.randn(h, n, s, generator=gen, dtype=torch.float64)  # (H, N, S)
    bias[1, 9, :] = -math.inf  # another dead row, through the bias
    bias[2, :, 3] = -math.inf
    ours = check_against_truth(q, k, v, mask=mask, bias=bias, causal=causal)
    out, _lse = ours[0], ours[1]
    assert (out[0, :, 5] == 0).all() and (out[:, 1, 9] == 0).all()
    for g in ours[2:]:
        assert torch.isfinite(g).all()


@needs_kernel
def test_broadcast_masks_of_every_shape():
    q, k, v = make(2, 3, 3, 40, 50, 16, 16, seed=3)
    gen = torch.Generator().manual_seed(4)
    lengths = torch.tensor([50, 21])
    pad = (torch.arange(50) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    rows = torch.rand(2, 1, 40, 1, generator=gen) > 0.2  # (B, 1, N, 1): stride-0 keys
    square = torch.rand(40, 50, generator=gen) > 0.5  # (N, S)
    for mask in (pad, rows, square, square.t().contiguous().t()):  # last: column-major
        check_against_truth(q, k, v, mask=mask)


@needs_kernel
@pytest.mark.parametrize("scale", [6.0, 30.0])
def test_scores_far_below_the_row_max_match_the_truth(scale):
    """Scores 50-600 below their row's maximum, where the kernel's vectorised exp underflows
    to 0 exactly (from -87.68 on) or to the smallest floats (denormal included), across both
    the full vectors and the padded last vector of a row (S = 97). At scale 30 the scores
    reach ~600 and the gradients' errors are 2-7x the naive float32 ones (dq 1.0e-3 vs 4.7e-4,
    causal dk 1.2e-3 vs 2.5e-4, dv 2.1e-5 vs 3.2e-6): the backward recomputes
    P = exp(s - lse) from a float32 lse, whose rounding (~|s| eps) the exponential carries into
    every entry; hence 10x there."""
    factor = 2.0 if scale < 10 else 10.0
    check_against_truth(*make(1, 2, 2, 33, 97, 16, 8, seed=3), scale=scale, factor=factor)
    check_against_truth(
        *make(1, 2, 2, 33, 97, 16, 8, seed=3), causal=True, scale=scale, factor=factor
    )


@needs_kernel
def test_wide_forward_blocks_match_the_truth():
    """A full forward from N = 768 on walks 256-row query blocks (`_blocks.forward_blocks`):
    N = 777 ends on a 9-row block."""
    check_against_truth(*make(1, 2, 1, 777, 97, 16, 8, seed=4))


@needs_kernel
def test_dropout_same_entries_as_pytorch_kernel_and_truth():
    q, k, v = make(2, 4, 2, 150, 530, 24, 24, seed=5)
    bias = torch.randn(1, 4, 150, 530, dtype=torch.float64)
    p, seed = 0.2, 99
    torch.manual_seed(seed)
    keep = dropout_keep_mask(draw_seed(), (2, 4, 150, 530), p)
    kw = {"bias": bias, "causal": True, "dropout_p": p, "training": True}
    ours = check_against_truth(q, k, v, keep=keep, p=p, seed=seed, **kw)
    # the PyTorch kernel (other blocks, float32) drops the very same entries
    theirs_in = leaves(q, k, v)
    torch.manual_seed(seed)
    theirs = all_results(
        *run(*theirs_in, kernel="torch", **{**kw, "bias": bias.float()}), theirs_in
    )
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@needs_kernel
def test_keep_words_match_the_pytorch_definition():
    seed = 1234567891234
    got = native.keep_words(seed, 2, 3, 5, 77)  # (B, H, N, S) int32 bits
    rows = row_ids(2, 3, 5, 0, 5)
    assert torch.equal(as_unsigned(got).view(30, 77), keep_words(seed, rows, 0, 77))
    for p in (0.001, 0.1, 0.5, 0.9):
        t, _ = keep_threshold(p)
        assert torch.equal(as_unsigned(got) < t, dropout_keep_mask(seed, (2, 3, 5, 77), p))


@needs_kernel
def test_dropout_unbiased_and_reproducible():
    q, k, v = leaves(*make(1, 2, 2, 16, 24, 8, 8, seed=6))
    ref = naive(*(t.double() for t in (q, k, v)), scale=8**-0.5)[0]
    with torch.no_grad():
        torch.manual_seed(0)
        outs = torch.stack([run(q, k, v, dropout_p=0.3, training=True)[0] for _ in range(2000)])
        torch.manual_seed(0)
        again = run(q, k, v, dropout_p=0.3, training=True)[0]
    assert torch.equal(again, outs[0]) and not torch.equal(outs[0], outs[1])
    err = (outs.double().mean(0) - ref).abs()
    assert (err < 5 * outs.double().std(0) / math.sqrt(2000) + 1e-6).all()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_compute_in_float32(dtype):
    q, k, v = make(1, 2, 1, 33, 45, 16, 16, seed=7)
    lo = leaves(q, k, v, dtype=dtype)
    out, lse = run(*lo, causal=True)
    up = leaves(*(t.to(dtype) for t in (q, k, v)))  # the same rounded inputs in float32
    out32, lse32 = run(*up, causal=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert torch.equal(out, out32.to(dtype)) and torch.equal(lse, lse32)
    for g, g32 in zip(grads(out, lse, lo), grads(out32.to(dtype), lse32, up), strict=True):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), g32.to(dtype).float(), atol=1e-2, rtol=1e-2)


@needs_kernel
def test_noncontiguous_inputs_and_thread_counts():
    q, k, v = make(2, 4, 4, 96, 96, 32, 32, seed=8)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # MHA-like
    assert not qt.is_contiguous()
    dense_in = leaves(q, k, v)
    dense = all_results(*run(*dense_in), dense_in)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ins = leaves(qt, kt, vt)
            got = all_results(*run(*ins, dropout_p=0.0), ins)
            for a, b in zip(got, dense, strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_single_kv_head_backward_splits_across_threads():
    # B·Hkv = 1 < threads: the backward cuts the query blocks into runs of equal work and adds
    # their dk, dv sums in run order (_native/partition.h)
    q, k, v = make(1, 2, 1, 600, 600, 16, 16, seed=9)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        check_against_truth(q, k, v, causal=True)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_refusals_name_the_reason():
    q, k, v = make(1, 1, 1, 4, 4, 8, 8)  # float64: the PyTorch kernel's job
    with pytest.raises(ValueError, match="kernel='native' cannot run this call"):
        run(q, k, v)
    with pytest.raises(ValueError, match="kernel must be"):
        run(*leaves(q, k, v), kernel="fast")


@needs_kernel
def test_bias_with_gradient_goes_to_pytorch_kernel():
    q, k, v = leaves(*make(1, 2, 2, 9, 11, 8, 8))
    bias = torch.randn(2, 9, 11, requires_grad=True)
    assert not native.supports(q, bias) and native.supports(q, bias.detach())
    out, _lse = run(q, k, v, bias=bias, kernel="auto")
    (gb,) = torch.autograd.grad(out.sum(), [bias])
    assert torch.isfinite(gb).all() and gb.abs().sum() > 0


def test_without_the_kernel_chunked_still_runs():
    code = (
        "import torch, warnings\n"
        "from attnkit.functional import native\n"
        "from attnkit.functional.chunked import chunked_attention\n"
        "assert not native.available()\n"
        "q = torch.randn(1, 2, 5, 8)\n"
        "out, lse = chunked_attention(q, q, q, mask=None, bias=None, causal=True, scale=0.3,"
        " dropout_p=0.0, training=False)\n"
        "assert out.shape == (1, 2, 5, 8) and torch.isfinite(out).all()\n"
    )
    env = {"ATTNKIT_NATIVE": "0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNKIT_NATIVE", raising=False)
    monkeypatch.setattr(_kernel_cache, "_lib", None)
    monkeypatch.setattr(_kernel_cache, "_tried", False)
    monkeypatch.setenv("ATTNKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(_kernel_cache, "_compiler", lambda: "/bin/false")
    with pytest.warns(RuntimeWarning, match="compiled CPU attention kernel is unavailable"):
        assert native.load() is None
    q = torch.randn(1, 1, 3, 4)
    assert not native.supports(q, None)
    out, _ = chunked_attention(
        q, q, q, mask=None, bias=None, causal=False, scale=0.5, dropout_p=0.0, training=False
    )
    assert torch.isfinite(out).all()
    assert list(tmp_path.rglob("*.so")) == []  # nothing half-written left behind


@needs_kernel
@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_nan_input_stays_nan_in_out_lse_and_gradients(kernel):
    q, k, v = leaves(*make(2, 2, 2, 6, 9, 8, 8, seed=10))
    with torch.no_grad():
        q[0, 1, 3, 2] = math.nan
    out, lse = run(q, k, v, kernel=kernel)
    assert out[0, 1, 3].isnan().all() and lse[0, 1, 3].isnan()  # not an empty row (-inf)
    (dq,) = torch.autograd.grad(out.nansum() + lse.nansum(), [q])
    assert dq[0, 1, 3].isnan().all()  # the NaN is not hidden as a zero gradient
    keep = torch.ones(2, 2, 6, dtype=torch.bool)
    keep[0, 1, 3] = False
    assert torch.isfinite(out[keep]).all() and torch.isfinite(lse[keep]).all()


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """`native.load` as in a new process, with its cache under tmp_path."""
    monkeypatch.delenv("ATTNKIT_NATIVE", raising=False)
    monkeypatch.setattr(_kernel_cache, "_lib", None)
    monkeypatch.setattr(_kernel_cache, "_tried", False)
    monkeypatch.setenv("ATTNKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path


@needs_kernel
def test_damaged_cache_entry_is_rebuilt(fresh_loader, capfd):
    # what a full disk or a killed copy in another process leaves where the library should be
    lib = _kernel_cache._library_path(_kernel_cache._compiler())
    lib.parent.mkdir(mode=0o700, parents=True)
    lib.write_bytes(b"not a shared library")
    assert native.load() is not None
    assert lib.stat().st_size > 1000
    assert "compiling the CPU attention kernel" in capfd.readouterr().err


@needs_kernel
def test_unwritable_cache_falls_back_to_a_private_temp_folder(fresh_loader, monkeypatch):
    blocker = fresh_loader / "cache"
    blocker.write_text("a file where the cache folder should be")  # mkdir fails
    monkeypatch.setattr(_kernel_cache.tempfile, "gettempdir", lambda: str(fresh_loader / "tmp"))
    assert native.load() is not None
    assert list((fresh_loader / "tmp").rglob("attention_cpu-*.so"))


def test_the_kernel_instruction_set_is_chosen_by_its_variable_and_keys_the_cache(monkeypatch):
    cxx = _kernel_cache._compiler() or "g++"
    monkeypatch.delenv("ATTNKIT_KERNEL_ISA", raising=False)
    native_path = _kernel_cache._library_path(cxx)
    monkeypatch.setenv("ATTNKIT_KERNEL_ISA", "avx2")
    assert _kernel_cache.kernel_isa() == "avx2"
    assert "-march=x86-64-v3" in _kernel_cache._flags()
    assert _kernel_cache._library_path(cxx) != native_path  # its own library, side by side
    monkeypatch.setenv("ATTNKIT_KERNEL_ISA", "avx3")
    with pytest.raises(ValueError, match="ATTNKIT_KERNEL_ISA must be one of native, avx512, avx2"):
        _kernel_cache.kernel_isa()
