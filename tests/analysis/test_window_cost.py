"""Swin's relative bias in `swin_window_cost`: one add per score on both paths; the memory of
the score function (the table's size) and of the dense (H, M², M²) bias, against what attnkit
allocates (`PeakTensors`). Matmuls and parameters: test_cost.py."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import score_mods
from attnkit.analysis import mha_cost, swin_window_cost
from attnkit.analysis.peak_tensors import PeakTensors
from attnkit.vision import WindowAttention

pytestmark = pytest.mark.threads(1)


@pytest.mark.parametrize(("gh", "gw", "h", "m"), [(14, 14, 3, 7), (9, 5, 2, 4), (3, 3, 2, 2)])
def test_relative_bias_is_one_add_per_score_on_both_paths(gh, gw, h, m):
    c, b = 4 * h, 2
    cost = swin_window_cost(gh, gw, c, h, m, batch=b)
    dense = swin_window_cost(gh, gw, c, h, m, batch=b, dense=True)
    m = min(m, gh, gw)  # a grid no larger than the window is one window of min(h, w)
    windows = -(-gh // m) * -(-gw // m)
    assert cost.elementwise["position bias"] == b * windows * h * m**4
    assert cost.elementwise == dense.elementwise and cost.macs == dense.macs
    assert cost.elementwise["bias"] == b * windows * mha_cost(m * m, c, h).elementwise["bias"]
    table = (2 * m - 1) ** 2
    assert cost.memory == {"relative values": h * table, "relative index": table + 2 * m * m}
    assert dense.memory == {"relative bias": h * m**4, "relative index": m**4}
    assert (
        cost.params == dense.params
        and cost.to_dict()["memory_elements"] == (h + 1) * table + 2 * m * m
    )


def _peak(fn) -> int:
    fn()  # warm: caches and compiled kernels outside the count
    with PeakTensors() as p:
        fn()
    return p.peak


@pytest.mark.parametrize("backend", ["auto", "chunked"])
def test_window_score_function_allocates_the_table_size_not_the_bias(backend):
    h, m, d, windows = 4, 7, 8, 6
    q, k, v = (torch.randn(windows, h, m * m, d) for _ in range(3))  # (nW, H, M², d)
    layer = WindowAttention(h * d, h, m)
    rel = score_mods.relative_bias(layer.bias_table, score_mods.window_offsets(m))
    plain = _peak(lambda: attnkit.attention(q, k, v, backend=backend))
    extra = _peak(lambda: attnkit.attention(q, k, v, score_mod=rel, backend=backend)) - plain
    mem = swin_window_cost(m, m, h * d, h, m).memory
    # float32 values, int64 indices; 16 bytes for the 0-d scalars a call allocates besides
    assert extra <= 4 * mem["relative values"] + 8 * mem["relative index"] + 16
    assert extra < 4 * h * m**4  # never the (H, M², M²) bias
    dense = swin_window_cost(m, m, h * d, h, m, dense=True).memory
    with_bias = _peak(
        lambda: attnkit.attention(q, k, v, bias=layer.relative_bias(), backend=backend)
    )
    assert with_bias - plain >= 4 * dense["relative bias"]
