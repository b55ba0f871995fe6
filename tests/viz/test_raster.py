"""Pictures drawn with Pillow alone (what `attnkit explain` writes): colours, layout, bounds."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from attnkit.viz.raster import head_distance_png, model_view_png, pool_tokens, viridis


def _image(png: bytes) -> np.ndarray:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_viridis_matches_matplotlibs_table():
    from matplotlib import colormaps

    x = np.linspace(0.0, 1.0, 256)
    want = np.rint(colormaps["viridis"](x)[:, :3] * 255)
    assert np.abs(viridis(x).astype(int) - want).max() <= 3  # indistinguishable by eye
    assert viridis(np.array([-1.0, np.nan, 2.0])).tolist() == [
        [68, 1, 84],
        [68, 1, 84],
        [253, 231, 37],
    ]


def test_model_view_cells_carry_the_weights_colour():
    """Each heatmap pixel is viridis(weight / largest weight), tiles in layer × head order."""
    g = torch.Generator().manual_seed(0)
    maps = torch.rand(2, 3, 4, 5, generator=g).softmax(-1)  # (L, H, n, s)
    cell = 40
    png = model_view_png(
        maps, list("abcd"), list("vwxyz"), ["L0", "L1"], ["h0", "h1", "h2"], "t\nnote", cell=cell
    )
    img = _image(png)
    left, top, gap = 150, 64, 8  # the layout constants of model_view_png
    assert img.shape == (top + 2 * (cell + gap) + 120, left + 3 * (cell + gap) + 90, 3)
    want = viridis((maps / maps.max()).numpy())
    for li in range(2):
        for hi in range(3):
            for i in range(4):
                for j in range(5):
                    y = top + li * (cell + gap) + int((i + 0.5) * cell / 4)
                    x = left + hi * (cell + gap) + int((j + 0.5) * cell / 5)
                    assert img[y, x].tolist() == want[li, hi, i, j].tolist(), (li, hi, i, j)


def test_head_distance_png_draws_one_dot_per_head_in_entropy_colours():
    distance = torch.tensor([[1.0, 4.0], [2.0, 8.0]])  # (L, H)
    entropy = torch.tensor([[0.0, 1.0], [0.5, 1.0]])
    img = _image(head_distance_png(distance, entropy, ["a", "b"], "title", "tokens"))
    assert img.shape == (420, int(100 * (1.2 + 0.9 * 6)), 3)
    low, high = viridis(np.array([0.0, 1.0]))
    flat = img.reshape(-1, 3)
    assert (flat == low).all(-1).sum() > 10  # the entropy-0 dot (and the colour bar end)
    assert (flat == high).all(-1).sum() > 10


def test_pool_tokens_bounds_the_grid():
    data = torch.rand(1, 1, 200, 200).softmax(-1)
    pooled, labels, block = pool_tokens(
        data, [f"t{i}" for i in range(200)], dim=3, max_blocks=64, op="sum"
    )
    assert pooled.shape == (1, 1, 200, 50) and block == 4 and labels[1] == "4–7 t4…"
    torch.testing.assert_close(pooled.sum(-1), torch.ones(1, 1, 200))


def test_explains_rendering_imports_no_matplotlib(tmp_path):
    """`attnkit explain` draws its PNGs without matplotlib (its import alone took ~1 s)."""
    code = f"""
import sys, torch
from pathlib import Path
from attnkit.analysis.heads import head_stats
from attnkit.cli._render import write_all
maps = torch.rand(2, 3, 5, 5).softmax(-1)
stats = head_stats(maps[:, None])
meta = {{"text": "a b c", "focus": {{"token": "b", "index": 2}}, "heads": [0, 1, 2]}}
write_all(Path({str(tmp_path)!r}), list("xabcy"), maps, ["0", "1"], meta, stats)
assert "matplotlib" not in sys.modules, "matplotlib was imported"
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["attention.json", "head_distance.png", "head_view.html", "model_view.png"]
    )


@pytest.mark.parametrize("n", [3, 512])
def test_explains_model_view_stays_within_the_size_caps(n, tmp_path):
    from attnkit.cli._render import _model_view_png
    from attnkit.viz import AttentionMaps

    attn = AttentionMaps([f"w{i}" for i in range(n)], torch.rand(6, 12, n, n).softmax(-1))
    w, h = Image.open(io.BytesIO(_model_view_png(attn, "t", list(range(12))))).size
    assert w <= 2200 and h <= 2000
