"""torch.export (strict and non-strict, dynamic batch and length), ONNX through onnxruntime,
and torch.jit.trace agree with eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim

from attnkit.modules import MultiHeadAttention
from tests.deploy._models import build, hf_mask

ATOL = 1e-5
BATCH, LENGTH = Dim("batch", min=1, max=16), Dim("length", min=2, max=32)
SIZES = [(1, 4), (5, 9), (3, 11)]  # (B, N) other than the (2, 7) traced with


def _bert_inputs(b, n):
    g = torch.Generator().manual_seed(b * 100 + n)
    mask = hf_mask(max(b, 2), n)[:b]
    return torch.randint(1, 50, (b, n), generator=g), mask


@pytest.fixture(scope="module")
def bert():
    m, _, _ = build("bert")
    return m.eval()


@pytest.fixture(scope="module")
def vit():
    m, _, _ = build("vit")
    return m.eval()


@pytest.mark.slow
@pytest.mark.parametrize("strict", [True, False])
def test_export_bert_dynamic_batch_and_length(bert, strict):
    ids, mask = _bert_inputs(2, 7)
    dims = {0: BATCH, 1: LENGTH}
    ep = torch.export.export(bert, (ids, mask), dynamic_shapes=(dims, dims), strict=strict)
    for b, n in SIZES:
        ids, mask = _bert_inputs(b, n)
        got, want = ep.module()(ids, mask), bert(ids, mask)
        assert type(got) is type(want)  # BertOutput is a pytree: it comes back whole
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=ATOL,
                                   rtol=ATOL)  # fmt: skip
        torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=ATOL, rtol=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("strict", [True, False])
def test_export_vit_dynamic_batch(vit, strict):
    """ViT's length is fixed by the image size; the batch is dynamic."""
    images = torch.randn(2, 1, 8, 8)
    ep = torch.export.export(vit, (images,), dynamic_shapes=({0: BATCH},), strict=strict)
    for b in (1, 5, 9):
        images = torch.randn(b, 1, 8, 8)
        torch.testing.assert_close(ep.module()(images), vit(images), atol=ATOL, rtol=ATOL)


def _onnx_run(program, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(program.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {k: v.numpy() for k, v in zip(names, feeds, strict=True)})


@pytest.mark.slow
def test_onnx_bert_in_onnxruntime(bert):
    pytest.importorskip("onnxruntime")
    ids, mask = _bert_inputs(2, 7)
    dims = {0: BATCH, 1: LENGTH}
    program = torch.onnx.export(bert, (ids, mask), dynamic_shapes=(dims, dims), dynamo=True)
    for b, n in SIZES:
        ids, mask = _bert_inputs(b, n)
        got = torch.from_numpy(_onnx_run(program, (ids, mask))[0])
        torch.testing.assert_close(got, bert(ids, mask).last_hidden_state, atol=ATOL, rtol=ATOL)


@pytest.mark.slow
def test_onnx_vit_in_onnxruntime(vit):
    pytest.importorskip("onnxruntime")
    images = torch.randn(2, 1, 8, 8)
    program = torch.onnx.export(vit, (images,), dynamic_shapes=({0: BATCH},), dynamo=True)
    for b in (1, 5, 9):
        images = torch.randn(b, 1, 8, 8)
        got = torch.from_numpy(_onnx_run(program, (images,))[0])
        torch.testing.assert_close(got, vit(images), atol=ATOL, rtol=ATOL)


class _Masked(nn.Module):
    """MultiHeadAttention with the mask as a positional input (jit.trace takes positionals)."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        self.mha = mha

    def forward(self, x, mask):
        return self.mha(x, mask=mask)


@pytest.mark.parametrize("dead_when_traced", [True, False])
def test_jit_trace_mha_fully_masked_rows(dead_when_traced):
    torch.manual_seed(0)
    m = _Masked(MultiHeadAttention(16, 4)).eval()
    x = torch.randn(2, 5, 16)
    traced_mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    if dead_when_traced:
        traced_mask[1, :, 2] = False  # query 2 of row 1 sees nothing
    traced = torch.jit.trace(m, (x, traced_mask))
    run_mask = torch.rand(2, 1, 5, 5) > 0.4
    run_mask[0, :, 4] = False  # a different query sees nothing at run time
    got, want = traced(x, run_mask), m(x, run_mask)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
    # a fully masked query's attention output is 0: the module returns proj(0) = its bias
    torch.testing.assert_close(got[0, 4], m.mha.proj.bias.detach().expand(16))
