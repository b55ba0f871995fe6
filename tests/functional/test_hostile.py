"""attention() under random, often wrong, input: a clear error or the right answer, never
anything else (no IndexError, ZeroDivisionError, RuntimeError from deep inside, no NaN).

B batch, H query heads, Hkv key/value heads, N queries, S keys, D head width, Dv value width.
"""

from __future__ import annotations

import re

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import attention
from tests.naive import naive_attention

ARGUMENTS = ("q", "k", "v", "mask", "bias", "dropout_p", "scale", "backend", "head width", "heads")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 3e-3, torch.bfloat16: 3e-2}


@st.composite
def calls(draw):
    """Shapes near the valid ones (sizes 0-5, sometimes off by one, sometimes the wrong rank),
    masks and biases of random ranks and dtypes, odd scales and dropout values."""
    b, hkv, g, n, s, d, dv = (draw(st.integers(0, 4)) for _ in range(7))
    h = hkv * max(g, 1) + draw(st.sampled_from([0, 0, 0, 1]))  # sometimes not a multiple
    dtype = draw(st.sampled_from(DTYPES[:4] * 3 + DTYPES[4:]))

    def shape(*dims):
        dims = list(dims)
        if draw(st.integers(0, 9)) == 0:  # the wrong rank
            dims = dims[: draw(st.integers(0, 3))] or [2]
        elif draw(st.integers(0, 9)) == 0:  # one size off
            i = draw(st.integers(0, len(dims) - 1))
            dims[i] += 1
        return dims

    def tensor(dims, dt):
        if dt == torch.bool:
            return torch.rand(dims) > 0.3
        if not dt.is_floating_point:
            return torch.randint(0, 3, dims, dtype=dt)
        return torch.randn(dims, dtype=torch.float64).to(dt)

    q, k, v = (
        tensor(shape(*dims), dtype) for dims in ((b, h, n, d), (b, hkv, s, d), (b, hkv, s, dv))
    )
    mask = bias = None
    if draw(st.booleans()):
        rank = draw(st.integers(1, 5))
        full = [b, 1, n, s][-rank:] if rank <= 4 else [1, b, 1, n, s]
        mdtype = draw(st.sampled_from([torch.bool] * 4 + [torch.float32, torch.int64]))
        mask = tensor([x if draw(st.integers(0, 5)) else 1 for x in full], mdtype)
    if draw(st.booleans()):
        bias = tensor([1, h, n, s] if draw(st.integers(0, 5)) else [n + 1, s], dtype)
    kwargs = {
        "mask": mask,
        "bias": bias,
        "causal": draw(st.booleans()),
        "scale": draw(st.sampled_from([None, None, 0.5, 0.0, -1.0, float("nan"), float("inf")])),
        "dropout_p": draw(st.sampled_from([0.0, 0.0, 0.2, 1.0, -0.1])),
        "backend": draw(st.sampled_from(["auto", "reference", "fused", "chunked", "flash"])),
    }
    return q, k, v, kwargs


def _valid_outcome(q, k, v, kw, res) -> None:
    """A call that did not raise must be right: shapes, dtype, and values vs float64."""
    b, h, n, _ = q.shape
    assert res.out.shape == (b, h, n, v.shape[3]) and res.out.dtype == q.dtype
    if kw["scale"] is not None and kw["scale"] != kw["scale"]:
        raise AssertionError("a NaN scale must have been refused")
    if res.out.numel() == 0 or k.shape[2] == 0:  # nothing to compute, or no key: zeros
        assert (res.out == 0).all()
        return
    want, _ = naive_attention(q, k, v, mask=kw["mask"], bias=kw["bias"], causal=kw["causal"],
                              scale=kw["scale"])  # fmt: skip
    assert torch.isfinite(res.out).all()
    err = (res.out.double() - want).abs().max().item() if want.numel() else 0.0
    assert err <= TOLERANCE[q.dtype] * max(1.0, want.abs().max().item() if want.numel() else 1.0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=calls())
def test_random_calls_give_a_clear_error_or_the_right_answer(call):
    q, k, v, kw = call
    try:
        res = attention(q, k, v, **kw)
    except ValueError as err:
        message = str(err)
        assert "\n" not in message and len(message) < 400
        assert any(re.search(rf"\b{re.escape(a)}\b", message) for a in ARGUMENTS), message
        return
    # accepted: dropout at p = 0 only (training=False), so the result is deterministic
    _valid_outcome(q, k, v, kw, res)


def test_shape_check_guards_on_symbolic_sizes_instead_of_refusing():
    """Under torch.compile's dynamic shapes a static mask meets symbolic sizes: (3, 1, 1, 10)
    against (s0, 4, s1, s1) is accepted (guarding s0 == 3, s1 == 10); a size that cannot
    broadcast is still refused."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from attnkit.functional._validate import _broadcasts_to

    env = ShapeEnv()

    def sym(name: str, hint: int):
        return env.create_symintnode(env.create_symbol(hint, ConstantSource(name)), hint=hint)

    b, n = sym("b", 3), sym("n", 10)
    full = (b, 4, n, n)
    assert _broadcasts_to((3, 1, 1, 10), full)
    assert _broadcasts_to((b, 1, 1, n), full)
    assert not _broadcasts_to((2, 1, 1, 10), full)
    assert not _broadcasts_to((1, 1, 1, 1, 10), full)
    assert _broadcasts_to((10,), (3, 4, 10, 10)) and not _broadcasts_to((4, 1), (3, 4, 10, 10))
