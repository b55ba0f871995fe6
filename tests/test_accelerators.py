"""attention() and the modules on GPUs (CUDA, MPS), checked against the float64 truth.

These run where an accelerator exists; on a machine without one every test here is
skipped with a reason that `pytest -ra` prints ("no CUDA GPU here: ..."). The CPU-only
tests pin device-correctness without one (meta device, default device), see
tests/functional/test_portability.py and tests/test_devices.py.

B batch, H query heads, Hkv key/value heads, N queries, S keys, D head width.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from tests.naive import naive_attention


def _devices() -> list:
    found = []
    for name, present in (
        ("cuda", torch.cuda.is_available()),
        ("mps", hasattr(torch.backends, "mps") and torch.backends.mps.is_available()),
    ):
        reason = f"no {name.upper()} device here: the {name} float64-reference checks did not run"
        found.append(pytest.param(name, marks=pytest.mark.skipif(not present, reason=reason)))
    return found


DEVICES = _devices()
BACKENDS = ("reference", "fused", "chunked", "auto")


def _inputs(device, dtype, b=2, h=4, hkv=2, n=37, s=53, d=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(b, heads, length, d, generator=g, dtype=torch.float64)
        for heads, length in ((h, n), (hkv, s), (hkv, s))
    )
    mask = torch.rand(b, 1, n, s, generator=g) > 0.25
    mask[0, 0, 3] = False  # a row that sees nothing
    bias = torch.randn(1, h, n, s, generator=g, dtype=torch.float64)
    return (q, k, v, mask, bias), tuple(
        t.to(device=device, dtype=dtype if t.dtype.is_floating_point else t.dtype)
        for t in (q, k, v, mask, bias)
    )


TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("causal", [False, True])
def test_every_backend_matches_the_float64_truth(device, backend, dtype, causal):
    if device == "mps" and dtype == torch.bfloat16:
        pytest.skip("bfloat16 matmuls need macOS 14 on MPS")
    cpu, dev = _inputs(device, dtype)
    q, k, v, mask, bias = (t.requires_grad_() if t.is_floating_point() else t for t in dev)
    res = attnkit.attention(q, k, v, mask=mask, bias=bias, causal=causal, backend=backend)
    want, _ = naive_attention(*cpu[:3], mask=cpu[3], bias=cpu[4], causal=causal)
    assert res.out.device.type == device and res.out.dtype == dtype
    err = (res.out.double().cpu() - want).abs().max().item()
    assert err <= TOLERANCE[dtype], err
    assert (res.out[0, :, 3] == 0).all()  # the row that sees nothing
    res.out.float().square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all() and t.grad.device.type == device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_on_the_device_keeps_one_minus_p(device, backend):
    (_, (q, k, v, _, _)) = _inputs(device, torch.float32, b=4, h=4, hkv=4, n=256, s=256, d=8)
    k = torch.zeros_like(k)  # uniform probabilities 1/S: out reveals which were kept
    v = torch.eye(256, device=device)[None, None].expand(4, 4, 256, 256)
    p = 0.1
    out = attnkit.attention(q, k, v, dropout_p=p, training=True, backend=backend)
    kept = (out.out > 0).double().mean().item()
    n = out.out.numel()
    assert abs(kept - (1 - p)) < 5 * ((p * (1 - p)) / n) ** 0.5
    torch.testing.assert_close(out.out.max().item(), 1 / 256 / (1 - p), rtol=1e-3, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_multihead_attention_built_and_run_on_the_device(device):
    torch.manual_seed(0)
    ours = attnkit.MultiHeadAttention(32, 4, device=device, dtype=torch.float64)
    assert all(p.device.type == device for p in ours.parameters())
    x = torch.randn(3, 11, 32, dtype=torch.float64, device=device)
    pad = attnkit.masks.padding(torch.tensor([11, 7, 0], device=device), 11)
    got = ours(x, mask=pad)
    cpu = ours.to("cpu")
    torch.testing.assert_close(got.cpu(), cpu(x.cpu(), mask=pad.cpu()), atol=1e-12, rtol=0)
