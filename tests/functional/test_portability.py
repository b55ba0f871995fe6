"""attention() on other devices and inside compiled, exported and traced code: same meaning.

B batch, H query heads, Hkv key/value heads, N queries, S keys, D head width.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from attnkit import attention
from attnkit.functional import native
from attnkit.functional._dropout import keep_threshold

attention_module = importlib.import_module("attnkit.functional.attention")

BACKENDS = ("reference", "fused", "chunked")


def _inputs(device="cpu", b=2, h=4, hkv=2, n=7, s=9, d=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(b, heads, length, d, generator=g, dtype=dtype).to(device)
        for heads, length in ((h, n), (hkv, s), (hkv, s))
    )
    mask = torch.rand(b, 1, n, s, generator=g) > 0.3
    mask[0, 0, 2] = False  # one row sees nothing
    bias = torch.randn(1, h, n, s, generator=g, dtype=dtype)
    return q, k, v, mask.to(device), bias.to(device)


CALLS = {
    "plain": {},
    "mask": {"use_mask": True},
    "bias": {"use_bias": True},
    "causal N<S": {"causal": True},
    "mask+bias+causal": {"use_mask": True, "use_bias": True, "causal": True},
    "dropout": {"use_mask": True, "dropout_p": 0.3, "training": True},
}


def _call(q, k, v, mask, bias, backend, use_mask=False, use_bias=False, **kw):
    return attention(
        q, k, v, mask=mask if use_mask else None, bias=bias if use_bias else None,
        backend=backend, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("backend", [*BACKENDS, "auto"])
@pytest.mark.parametrize("call", CALLS)
def test_every_backend_runs_on_the_meta_device(backend, call):
    q, k, v, mask, bias = _inputs("meta")
    q.requires_grad_()
    res = _call(q, k, v, mask, bias, backend, **CALLS[call])
    assert res.out.device.type == "meta" and res.out.shape == (2, 4, 7, 8)
    assert res.lse is None or res.lse.device.type == "meta"
    res.out.sum().backward()
    assert q.grad.device.type == "meta" and q.grad.shape == q.shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("call", CALLS)
def test_cpu_inputs_under_another_default_device_stay_on_the_cpu(backend, call):
    """Every buffer a backend makes follows its inputs, not torch's default device."""
    q, k, v, mask, bias = _inputs()
    torch.manual_seed(1)
    want = _call(q, k, v, mask, bias, backend, **CALLS[call])
    torch.manual_seed(1)
    torch.set_default_device("meta")
    try:
        got = _call(q, k, v, mask, bias, backend, **CALLS[call])
    finally:
        torch.set_default_device(None)
    assert got.out.device.type == "cpu"
    torch.testing.assert_close(got.out, want.out, rtol=0, atol=0)


def test_auto_off_the_cpu_runs_sdpa_which_does_dropout_and_masks_there():
    choose = attention_module._choose_backend
    for dropout in (False, True):
        got = choose("auto", need_weights=False, dropout=dropout, device_type="cuda")
        assert got == "fused"
        assert choose("auto", need_weights=False, dropout=dropout, mask_elems=1 << 30) == (
            "chunked"
        )
    assert choose("auto", need_weights=True, dropout=False, device_type="cuda") == "reference"


def test_a_mask_size_known_only_symbolically_adds_no_guard():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    big = env.create_unbacked_symint()  # a size nothing is known about
    choice = attention_module._choose_backend(
        "auto", need_weights=False, dropout=False, mask_elems=big
    )
    assert choice == "fused" and not env.guards


# --------------------------------------------------------------------------- non-finite input


def _agree(outs: dict) -> None:
    for backend in BACKENDS[1:]:
        want = outs["reference"]
        torch.testing.assert_close(outs[backend], want, equal_nan=True, atol=2e-6, rtol=0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("call", ["plain", "mask", "causal N<S", "mask+bias+causal"])
def test_a_non_finite_query_gives_a_nan_row_on_every_backend(value, call):
    outs = {}
    for backend in BACKENDS:
        q, k, v, mask, bias = _inputs()
        q[1, 1, 3, 2] = value
        res = _call(q, k, v, mask, bias, backend, **CALLS[call])
        bad = torch.zeros(2, 4, 7, dtype=torch.bool)
        bad[1, 1, 3] = True
        assert torch.isnan(res.out[bad]).all() and torch.isfinite(res.out[~bad]).all(), backend
        if res.lse is not None:
            assert torch.isnan(res.lse[bad]).all()
        outs[backend] = res.out
    _agree(outs)


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("call", ["plain", "mask", "causal N<S", "mask+bias+causal"])
def test_non_finite_keys_and_values_every_row_may_attend_give_one_answer(where, value, call):
    """Key 0 is visible to every row (rule 4 of the docstring leaves masked slots out)."""
    outs = {}
    for backend in BACKENDS:
        q, k, v, mask, bias = _inputs()
        mask[..., 0] = True
        mask[0, 0, 2] = False  # still one row that sees nothing
        {"k": k, "v": v}[where][1, 1, 0, 3] = value  # batch 1, kv head 1 (query heads 2, 3)
        res = _call(q, k, v, mask, bias, backend, **CALLS[call])
        outs[backend] = res.out
        assert torch.isfinite(res.out[0]).all() and torch.isfinite(res.out[1, :2]).all()
        if where == "v" or value != value:
            # a bad value reaches every row, a NaN key too; an infinite key gives a row a
            # score of +inf (NaN row) or -inf (weight 0), by the sign of its q
            assert (~torch.isfinite(res.out[1, 2:])).any(-1).all(), backend
    _agree(outs)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_plus_inf_in_the_bias_makes_exactly_the_rows_that_see_it_nan(value):
    q, k, v, mask, bias = _inputs()
    bias = bias.expand(2, 4, 7, 9).clone()
    bias[0, 1, 3, 2] = value  # row 3 of head 1, batch 0
    mask[0, 0, 4, 5] = False
    bias[0, 1, 4, 5] = value  # masked: never read
    for backend in BACKENDS:
        out = attention(q, k, v, mask=mask, bias=bias, backend=backend).out
        nan_rows = torch.isnan(out).any(-1)  # (B, H, N)
        want = torch.zeros_like(nan_rows)
        want[0, 1, 3] = bool(mask[0, 0, 3, 2])
        assert torch.equal(nan_rows, want), backend


# --------------------------------------------------------------------------- empty input


@pytest.mark.parametrize("backend", [*BACKENDS, "auto"])
@pytest.mark.parametrize(
    ("q_shape", "k_shape"),
    [((2, 4, 3, 8), (2, 2, 0, 8)), ((0, 4, 3, 8), (0, 2, 5, 8)), ((2, 0, 3, 8), (2, 0, 5, 8)),
     ((2, 4, 0, 8), (2, 2, 5, 8))],
)  # fmt: skip
def test_empty_inputs_give_the_empty_attention_result(backend, q_shape, k_shape):
    q = torch.randn(q_shape, requires_grad=True)
    k = torch.randn(k_shape, requires_grad=True)
    v = torch.randn(*k_shape[:3], 5, requires_grad=True)
    res = attention(q, k, v, backend=backend)
    assert res.out.shape == (*q_shape[:3], 5) and (res.out == 0).all()
    if res.lse is not None:
        assert res.lse.shape == q_shape[:3] and torch.isneginf(res.lse).all()
    res.out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and (t.grad == 0).all()
    weights = attention(q, k, v, need_weights=True).weights
    assert weights.shape == (*q_shape[:3], k_shape[2])


def test_zero_head_width_is_refused_naming_it():
    q = torch.randn(1, 2, 3, 0)
    with pytest.raises(ValueError, match=r"head width D >= 1.*q \(1, 2, 3, 0\)"):
        attention(q, q, q)
    with pytest.raises(ValueError, match="key/value heads Hkv=0"):
        attention(torch.randn(1, 2, 3, 4), torch.randn(1, 0, 3, 4), torch.randn(1, 0, 3, 4))


# --------------------------------------------------------------------------- compile, export


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=False)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["auto", "chunked", "reference"])
def test_fullgraph_compile_equals_eager(backend):
    """One graph per call kind, no break, same numbers (dropout with inductor's eager RNG)."""
    q, k, v, mask, bias = _inputs()
    for name, kw in CALLS.items():
        fn = _compiled(lambda q, k, v, m, b, kw=kw: _call(q, k, v, m, b, backend, **kw).out)
        with torch._inductor.config.patch(fallback_random=True):
            torch.manual_seed(5)
            got = fn(q, k, v, mask, bias)
        torch.manual_seed(5)
        want = _call(q, k, v, mask, bias, backend, **kw).out
        torch.testing.assert_close(got, want, atol=2e-6, rtol=0, msg=name)


@pytest.mark.slow
def test_compiled_gradients_through_the_kernel_operator_equal_eager():
    if not native.available():
        pytest.skip("no C++ compiler here: the compiled kernel's operator cannot run")
    q, k, v, mask, _ = _inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def step(q, k, v, mask):
        res = attention(q, k, v, mask=mask, backend="chunked", causal=True)
        return res.out.square().sum() + res.lse.clamp_min(-1e4).sum()

    counters.clear()
    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True)(*leaves, mask)
    grads = torch.autograd.grad(loss, leaves)
    want = torch.autograd.grad(step(*leaves, mask), leaves)
    for g, w in zip(grads, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)
    assert not counters["graph_break"]


@pytest.mark.slow
def test_export_keeps_batch_and_length_dynamic_with_a_mask():
    class Attn(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return attention(q, k, v, mask=mask).out

    q, k, v, mask, _ = _inputs(b=3, h=4, hkv=4, n=9, s=9)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dyn = {"q": {0: batch, 2: length}, "k": {0: batch, 2: length}, "v": {0: batch, 2: length}}
    dyn["mask"] = {0: batch, 2: length, 3: length}
    for strict in (True, False):
        program = torch.export.export(Attn(), (q, k, v, mask), dynamic_shapes=dyn, strict=strict)
        for b, n in ((2, 5), (5, 12)):
            q2, k2, v2, m2, _ = _inputs(b=b, h=4, hkv=4, n=n, s=n, seed=b)
            m2 = m2.expand(b, 1, n, n)
            got = program.module()(q2, k2, v2, m2)
            torch.testing.assert_close(got, attention(q2, k2, v2, mask=m2).out, atol=1e-6, rtol=0)


def test_jit_trace_keeps_fully_masked_rows_at_zero():
    """Traced with no empty row, run with one: the traced graph must not have baked in the
    "no row is empty" shortcut."""

    def fn(q, k, v, mask):
        return attention(q, k, v, mask=mask, need_weights=True).out

    q, k, v, mask, _ = _inputs(h=2, hkv=1)
    full = torch.ones_like(mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(fn, (q, k, v, full), check_trace=False)
    got = traced(q, k, v, mask)
    assert torch.isfinite(got).all() and (got[0, :, 2] == 0).all()
    torch.testing.assert_close(got, fn(q, k, v, mask), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dropout", [False, True])
def test_the_kernel_operator_and_its_eager_route_agree(dropout):
    """What traced code calls (attnkit::attention_fwd/bwd) equals what eager code calls."""
    if not native.available():
        pytest.skip("no C++ compiler here: the compiled kernel cannot run")
    q, k, v, mask, bias = _inputs(dtype=torch.float32)
    seed = torch.tensor(12345) if dropout else None
    keep_t, inv_keep = keep_threshold(0.2 if dropout else 0.0)
    args = (mask, bias, True, 0.3, keep_t, inv_keep, seed)
    results = []
    for route in (native._Eager.apply, native.attention_fwd):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = route(*leaves, *args)
        grads = torch.autograd.grad(out.square().sum() + lse.sum(), leaves)
        results.append((out, lse, *grads))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.slow
def test_a_first_call_inside_fullgraph_compile_stays_one_graph():
    """In a fresh process the kernel loader has not run yet: compiling must not trace it."""
    import subprocess
    import sys

    code = (
        "import torch, attnkit\n"
        "q = torch.randn(1, 2, 8, 16)\n"
        "f = torch.compile(lambda q: attnkit.attention(q, q, q, backend='chunked').out,"
        " fullgraph=True)\n"
        "want = attnkit.attention(q, q, q, backend='reference').out\n"
        "assert torch.allclose(f(q), want, atol=1e-6)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("backend", [*BACKENDS, "auto"])
def test_masks_and_biases_of_low_rank_broadcast_like_4d_ones(backend):
    """A (S,) mask or an (N, S) bias is a view of a (1, 1, N|1, S) one on every backend."""
    q, k, v, _, bias = _inputs(b=1, h=2, hkv=2, n=3, s=5)
    keys = torch.tensor([True, False, True, True, False])
    got = attention(q, k, v, mask=keys, bias=bias[0, 0], backend=backend).out
    want = attention(q, k, v, mask=keys[None, None, None], bias=bias[:, :1], backend=backend).out
    torch.testing.assert_close(got, want, rtol=0, atol=0)
