"""On CUDA, structure goes to FlexAttention: `auto`'s routing as a table (device_type="cuda"
given to `_choose_backend`, so it runs on the CPU), `_flex_backend.fits` on `meta` tensors, and
the route itself (`attention` taking the "flex" branch, the mask as a BlockMask, the score
function in Flex's kernel) run on the CPU against attnkit's chunked kernel, with FlexAttention's
compiled CPU forward standing in for its CUDA kernels."""

from __future__ import annotations

import importlib

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit import score_mods as sm
from attnkit.functional import _flex_backend
from attnkit.functional._index_fns import ScoreFn
from attnkit.functional.attention import _choose_backend

attention_module = importlib.import_module("attnkit.functional.attention")


def _custom(score, b, h, q_idx, kv_idx):
    return score * 0.5


SOFTCAP, ALIBI = sm.softcap(20.0), sm.alibi(torch.ones(4))

# (device, structured, score_mod, flex_fits, extra) -> backend auto picks
ROUTES = [
    ("cuda", True, None, True, {}, "flex"),
    ("cuda", True, SOFTCAP, True, {}, "flex"),
    ("cuda", False, SOFTCAP, True, {}, "flex"),
    ("cuda", False, ALIBI, True, {}, "flex"),
    ("cuda", True, None, False, {}, "fused"),  # Flex cannot run it: SDPA with .dense()
    ("cuda", False, None, True, {}, "fused"),  # no structure, no score function: SDPA
    ("cuda", False, ALIBI, False, {}, "fused"),  # additive built-in as a dense bias
    ("cuda", False, _custom, False, {}, "chunked"),  # a function of the user's own
    ("cuda", True, ScoreFn(_custom), True, {}, "flex"),  # one given to the Flex drop-in
    ("cuda", True, None, True, {"need_weights": True}, "reference"),
    ("cpu", True, None, True, {}, "chunked"),  # the CPU keeps its own kernel
    ("cpu", False, SOFTCAP, True, {}, "chunked"),
    ("mps", True, None, True, {}, "fused"),  # FlexAttention's route is CUDA's only
]


@pytest.mark.parametrize(("device", "structured", "score_mod", "fits", "extra", "want"), ROUTES)
def test_routing_table(device, structured, score_mod, fits, extra, want):
    kw = {"need_weights": False, "dropout": False, **extra}
    got = _choose_backend(
        "auto", device_type=device, structured=structured, score_mod=score_mod,
        flex_fits=fits, **kw,
    )  # fmt: skip
    assert got == want


def test_explicit_and_overridden_backends_are_kept_on_cuda():
    common = {"need_weights": False, "dropout": False, "device_type": "cuda", "structured": True}
    assert _choose_backend("chunked", flex_fits=True, **common) == "chunked"
    with attnkit.use_backend("fused"):
        assert _choose_backend("auto", flex_fits=True, **common) == "fused"


def _meta(dtype=torch.float16, d=64, dv=64):
    q = torch.empty(2, 4, 256, d, dtype=dtype, device="meta")
    return q, torch.empty(2, 4, 256, dv, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    ("change", "want"),
    [
        ({}, True),
        ({"dtype": torch.bfloat16}, True),
        ({"dtype": torch.float32, "d": 128, "dv": 16}, True),
        ({"dtype": torch.float64}, False),  # not a dtype of Flex's kernels
        ({"d": 80}, False),  # head width not a power of two
        ({"dv": 512}, False),
        ({"dropout": True}, False),  # Flex has no dropout
        ({"need_weights": True}, False),
        ({"bias": True}, False),  # a dense bias: SDPA
        ({"tensor_mask": True}, False),  # a boolean tensor: SDPA
        ({"score_mod": _custom}, False),  # not a built-in
        ({"score_mod": ScoreFn(_custom)}, True),  # given to the FlexAttention drop-in
        ({"score_mod": sm.compose(SOFTCAP, ALIBI)}, True),
    ],
)
def test_fits_from_static_facts(change, want):
    q, v = _meta(change.get("dtype", torch.float16), change.get("d", 64), change.get("dv", 64))
    mask = masks.window(256, 32)
    if change.get("tensor_mask"):
        mask = torch.ones(1, 1, 256, 256, dtype=torch.bool, device="meta")
    bias = torch.zeros(1, 1, 256, 256, device="meta") if change.get("bias") else None
    got = _flex_backend.fits(
        q, v, mask=mask, bias=bias, score_mod=change.get("score_mod", SOFTCAP),
        dropout=change.get("dropout", False), need_weights=change.get("need_weights", False),
    )  # fmt: skip
    assert got is want


def test_block_mask_is_built_once_per_mask_and_device():
    m = masks.window(256, 32)
    assert _flex_backend.block_mask_for(m, "cpu") is _flex_backend.block_mask_for(m, "cpu")
    assert _flex_backend.block_mask_for(m, "meta").kv_num_blocks.device.type == "meta"


@pytest.mark.slow
def test_flex_branch_of_attention_equals_chunked(monkeypatch):
    """attention's "flex" branch end to end, FlexAttention's compiled CPU forward standing in
    for CUDA: a document mask with a causal limit folded in, soft-capping then ALiBi, GQA
    (~15 s of compiling)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 256, 16, generator=g)
    k, v = (torch.randn(2, 2, 256, 16, generator=g) for _ in range(2))
    ids = masks.document_ids([100, 60, 96])
    mask, mod = masks.document(ids), sm.compose(SOFTCAP, sm.alibi(torch.linspace(0.1, 1, 4)))
    want = attnkit.attention(q, k, v, mask=mask, causal=True, score_mod=mod, backend="chunked")
    monkeypatch.setattr(attention_module, "_choose_backend", lambda *a, **kw: "flex")
    got = attnkit.attention(q, k, v, mask=mask, causal=True, score_mod=mod)
    torch.testing.assert_close(got.out, want.out, atol=2e-5, rtol=2e-5)
    assert got.lse is None  # Flex's compiled CPU kernel has no lse (its CUDA ones have)


def test_flex_route_returns_out_and_lse_as_on_cuda(monkeypatch):
    """`run` as on CUDA (lse asked for), with torch's uncompiled FlexAttention standing in for
    the compiled kernels: out and lse equal the chunked kernel's."""
    import warnings

    monkeypatch.setattr(_flex_backend, "_NO_LSE", ())
    monkeypatch.setattr(_flex_backend, "_compiled_flex", lambda: _flex_backend._flex_call)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 150, 16, generator=g) for _ in range(3))
    mask = masks.window(150, 20)
    want = attnkit.attention(q, k, v, mask=mask, causal=True, score_mod=SOFTCAP, backend="chunked")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warns that it is not compiled
        out, lse = _flex_backend.run(q, k, v, mask, True, 0.25, SOFTCAP)
    torch.testing.assert_close(out, want.out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, want.lse, atol=2e-5, rtol=2e-5)


def test_past_its_compile_limit_flex_declines_once_with_a_warning(monkeypatch):
    """Past the recompile limit torch.compile would run FlexAttention uncompiled (the whole
    score matrix: 30-60x SDPA's time on an H200, out of memory at N = 16384). attnkit's frame
    is compiled with fullgraph=True, so `run` gets the refusal and returns None, warning once;
    kernels compiled before still run."""
    import torch._dynamo

    torch._dynamo.reset()
    monkeypatch.setattr(_flex_backend, "RECOMPILES", 1)
    monkeypatch.setattr(_flex_backend, "_compiled", None)
    monkeypatch.setattr(_flex_backend, "_warned", False)
    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    small = [t[:, :, :24] for t in (q, k, v)]  # a new shape: a second kernel, past the limit
    try:
        with torch._dynamo.config.patch(recompile_limit=1):
            first = _flex_backend.run(q, k, v, masks.window(32, 8), False, 0.25, None)
            assert first is not None  # compiled: the frame's one kernel
            with pytest.warns(RuntimeWarning, match="FlexAttention has compiled 1 kernels"):
                assert _flex_backend.run(*small, masks.window(24, 8), False, 0.25, None) is None
            again = _flex_backend.run(q, k, v, masks.window(32, 8), False, 0.25, None)
        torch.testing.assert_close(again[0], first[0])  # the compiled one still runs
    finally:
        torch._dynamo.reset()


def test_attention_takes_the_next_route_when_flex_declines(monkeypatch):
    """`run` returning None sends the call where auto sends it without FlexAttention (on the
    CPU the chunked kernel; on CUDA SDPA with the dense mask): the same numbers."""
    real, picks = attention_module._choose_backend, []

    def choose(*a, flex_fits, **kw):  # "flex" first, as on CUDA; then the real choice
        picks.append("flex" if not picks else real(*a, flex_fits=flex_fits, **kw))
        return picks[-1]

    calls = []
    monkeypatch.setattr(attention_module, "_choose_backend", choose)
    monkeypatch.setattr(_flex_backend, "run", lambda *a: calls.append(1))  # declines: None
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = masks.window(40, 6)
    from tests.naive import naive_attention

    want, _ = naive_attention(q, k, v, mask=mask.dense())
    res = attnkit.attention(q, k, v, mask=mask)
    assert calls == [1] and picks == ["flex", "chunked"]
    torch.testing.assert_close(res.out, want, atol=1e-12, rtol=0)
