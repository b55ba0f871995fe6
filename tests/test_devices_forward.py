"""Forward passes on the `meta` device: output shape, dtype and device, for every row of
tests/device_cases.py, in eval mode, without and with a padding mask (padded tokens)."""

from __future__ import annotations

import pytest
import torch

from tests.device_cases import CASES, IDS, build, run

MASKED = [c for c in CASES if c.masked]


def _check(case, padded: bool, dtype: torch.dtype) -> None:
    m = build(case, device="meta", dtype=dtype).eval()
    with torch.no_grad():
        out = run(case, m, "meta", dtype, padded=padded)
    assert out.device.type == "meta"
    assert out.shape == case.shape and out.dtype == dtype


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_on_meta(case):
    _check(case, False, torch.float32)


@pytest.mark.parametrize("case", MASKED, ids=[c.id for c in MASKED])
def test_forward_on_meta_with_padding_mask(case):
    _check(case, True, torch.float32)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_on_meta_float64(case):
    _check(case, False, torch.float64)
