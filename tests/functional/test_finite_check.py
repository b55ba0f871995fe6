"""The kernel's finiteness scan (`_finite_scan.finite_check`, _native/finite.h) that rule 1 of
`attention`'s non-finite contract reads on the short path, against torch.isfinite; and rule 1
on chunked calls, where a finite lse stands for q."""

from __future__ import annotations

import importlib

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional import _fast_path, _finite_scan, native
from attnkit.functional.structured import RowIntervals

needs_kernel = pytest.mark.skipif(
    not native.available(),
    reason="compiled kernel unavailable (no C++ compiler, or ATTNKIT_NATIVE=0)",
)

DTYPES = list(_finite_scan.FINITE_CODES)
SIZES = (1, 7, 97, 1025)
BAD = (float("nan"), float("inf"), -float("inf"))


def scan(t: torch.Tensor) -> bool:
    addr, code = t.data_ptr(), _finite_scan.FINITE_CODES[t.dtype]
    answer = _finite_scan.finite_check()(addr & 0xFFFFFFFF, addr >> 32, t.numel(), code)
    assert answer in (0, 1)
    return answer == 1


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_scan_matches_isfinite_with_non_finite_values_planted(dtype, n):
    gen = torch.Generator().manual_seed(n)
    for trial in range(12):
        t = (torch.randn(n, generator=gen, dtype=torch.float64) * 100).to(dtype)
        bad = BAD[trial % 3]
        # one to three entries, the last element every fourth trial
        count = int(torch.randint(1, 4, (), generator=gen)) if trial % 4 else 1
        where = torch.randint(0, n, (count,), generator=gen) if trial % 4 else [n - 1]
        assert scan(t) and bool(torch.isfinite(t).all())
        t[where] = bad
        assert scan(t) == bool(torch.isfinite(t).all()) is False


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_extremes_of_the_finite_range_are_finite(dtype):
    info = torch.finfo(dtype)
    values = [info.max, -info.max, info.tiny, info.smallest_normal / 2, 0.0, -0.0]
    t = torch.tensor(values, dtype=dtype)
    assert t[3] != 0  # a denormal, kept
    assert scan(t) and scan(t[:0])  # and the empty tensor


@needs_kernel
def test_the_short_path_reads_only_the_view():
    """A contiguous slice is scanned from its own first element (storage offset) to its own
    last; a non-contiguous view (the sum instead) is judged by its own elements only."""
    whole = torch.randn(4, 8, 64)
    whole[0, 0, 0] = whole[3, 7, 63] = float("nan")
    assert whole[1:3].is_contiguous()
    assert _fast_path.surely_finite(whole[1:3]) and not _fast_path.surely_finite(whole[:2])
    assert not _fast_path.surely_finite(whole[2:])
    wide = torch.randn(3, 8, 70)
    wide[:, :, 64:] = float("inf")
    assert not wide[..., :64].is_contiguous() and _fast_path.surely_finite(wide[..., :64])
    assert not _fast_path.surely_finite(wide[..., :65])


@needs_kernel
def test_more_elements_than_a_c_int_take_the_sum(monkeypatch):
    """The scan's count is a C int: past it (q of 2^31 elements) the sum decides."""
    q = torch.randn(2, 3, 5)
    q[1, 2, 4] = float("nan")
    calls = []
    monkeypatch.setattr(_fast_path, "_isfinite", lambda x: calls.append(x) or False)
    assert not _fast_path._all_finite(q, q.dtype, _finite_scan.FINITE_MAX_NUMEL + 1)
    assert len(calls) == 1  # the sum's answer, not the scan's
    assert not _fast_path._all_finite(q, q.dtype, q.numel()) and len(calls) == 1


def test_finite_check_never_builds_the_kernel(monkeypatch, tmp_path):
    """With no library to load (no prebuilt one, none compiled before) the short path takes
    the sum and nothing is built: no compiler from a small call. It looks once per process."""
    from attnkit.functional import _kernel_cache

    monkeypatch.setattr(_finite_scan, "_all_finite", None)
    monkeypatch.setattr(_fast_path, "_scan", None)
    monkeypatch.setattr(_kernel_cache, "_tried", False)
    monkeypatch.setattr(_kernel_cache, "_lib", None)
    monkeypatch.setattr(_kernel_cache, "_looked", False)
    monkeypatch.setattr(_kernel_cache, "candidates", lambda source: iter(()))
    monkeypatch.setenv("ATTNKIT_CACHE", str(tmp_path))  # an empty cache
    monkeypatch.setattr(_kernel_cache, "_fallback_dir", lambda: tmp_path / "none")
    monkeypatch.setattr(_kernel_cache, "load", lambda: pytest.fail("finite_check loaded"))
    assert _finite_scan.finite_check() is None
    q = torch.randn(2, 3, 5)
    assert _fast_path.surely_finite(q)
    q[1, 2, 4] = float("nan")
    assert not _fast_path.surely_finite(q)
    assert _fast_path._scan is None and _kernel_cache._looked


def test_finite_check_loads_a_kernel_compiled_before(monkeypatch):
    """A kernel this machine compiled before (or the wheel's prebuilt one) is loaded by the
    first small call, which then scans instead of summing."""
    from attnkit.functional import _kernel_cache

    lib = _kernel_cache.load()
    if lib is None:
        pytest.skip("no compiled kernel on this machine (no C++ compiler)")
    monkeypatch.setattr(_finite_scan, "_all_finite", None)
    monkeypatch.setattr(_fast_path, "_scan", None)
    monkeypatch.setattr(_kernel_cache, "_tried", False)
    monkeypatch.setattr(_kernel_cache, "_lib", None)
    monkeypatch.setattr(_kernel_cache, "_looked", False)
    assert _finite_scan.finite_check() is not None  # loaded from the cache, not built
    assert _kernel_cache._tried and _kernel_cache._lib is not None


# --------------------------------------------------------------------------- chunked calls: lse


def _gap(n: int, first: int, end: int) -> RowIntervals:
    """Rows [first, end) see no key, the others a window of 5."""
    i = torch.arange(n)
    none = (i >= first) & (i < end)
    lo = torch.where(none, 0, (i - 2).clamp(min=0))
    return RowIntervals(lo, torch.where(none, 0, (i + 3).clamp(max=n)), n, "gap")


def _chunked(q, k, v, mask):
    return attnkit.attention(q, k, v, mask=mask, backend="chunked")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["none", "window", "strided", "document gap"])
@pytest.mark.parametrize("bad", BAD)
def test_chunked_rows_whose_q_is_not_finite_are_nan(dtype, kind, bad):
    """Rule 1 on the chunked backend, whose finite lse stands for q (`_lse_vouches_for_q`):
    the bad row is NaN in out and lse, whether its scores are NaN, ±inf (some keys positive in
    entry 0, some negative) or all -inf (every key negative in entry 0, q_0 = +inf: the
    kernel alone gives that row 0); a row that sees no key at all too. Other rows as before."""
    n = 97
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen, dtype=dtype) for _ in range(3))
    mask = {
        "none": None,
        "window": masks.window(n, 5),  # the row path
        "strided": masks.strided(n, 8),  # reordered (8 does not divide 97)
        "document gap": _gap(n, 40, 57),
    }[kind]
    want = _chunked(q, k, v, mask)
    for row, all_minus_inf in ((50, False), (50, True), (45, False)):
        k2 = k.clone()
        if all_minus_inf:
            k2[..., 0] = -k2[..., 0].abs() - 0.1
        q2 = q.clone()
        q2[0, 1, row, 0] = float("inf") if all_minus_inf else bad
        got = _chunked(q2, k2, v, mask)
        assert got.out[0, 1, row].isnan().all() and got.lse[0, 1, row].isnan()
        same = torch.ones(1, 2, n, dtype=torch.bool)
        same[0, 1, row] = False
        if not all_minus_inf:  # the other rows do not read q's bad row
            assert torch.equal(got.out[same], want.out[same])
            assert torch.equal(got.lse[same], want.lse[same])


def test_a_finite_lse_spares_the_scan_of_q(monkeypatch):
    """A chunked call whose lse is finite does not read q for rule 1; one with a row that sees
    nothing (lse -inf) or with dropout does."""
    attention_module = importlib.import_module("attnkit.functional.attention")
    seen = []
    real = attention_module.surely_finite
    monkeypatch.setattr(attention_module, "surely_finite", lambda t: seen.append(t) or real(t))
    q, k, v = (torch.randn(1, 2, 33, 8) for _ in range(3))
    _chunked(q, k, v, masks.window(33, 3))
    assert not any(t is q for t in seen) and len(seen) == 1  # the lse only
    seen.clear()
    _chunked(q, k, v, _gap(33, 16, 17))
    assert any(t is q for t in seen)  # a row that sees nothing: lse -inf
    seen.clear()
    attnkit.attention(q, k, v, backend="chunked", dropout_p=0.5, training=True)
    assert any(t is q for t in seen)
