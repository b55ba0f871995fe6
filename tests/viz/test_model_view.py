"""model_view: layers × heads heatmaps, one colour scale, bounded size for long inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from attnkit.viz import AttentionMaps, model_view, save_model_view
from attnkit.viz.figures import _pool


def probs(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 2).softmax(-1)


def images(fig: Figure) -> list:
    """The heatmaps, in row-major (layer, head) order."""
    return [ax.images[0] for ax in fig.axes if ax.images]


@pytest.fixture
def small() -> AttentionMaps:
    return AttentionMaps(
        ["q0", "q1", "q2", "q3"],
        probs(3, 4, 4, 5),
        key_tokens=list("abcde"),
        layer_names=["L-a", "L-b", "L-c"],
    )


def test_grid_of_layers_by_heads_with_one_colour_scale(small):
    fig = model_view(small)
    imgs = images(fig)
    assert len(imgs) == 12
    for i, im in enumerate(imgs):
        np.testing.assert_allclose(im.get_array(), small.maps[i // 4, i % 4].numpy(), rtol=1e-6)
    vmax = float(small.maps.max())
    assert [im.get_clim() for im in imgs] == [pytest.approx((0.0, vmax))] * 12
    (cbar,) = [ax for ax in fig.axes if ax.get_label() == "colorbar"]
    assert cbar.get_ylim() == pytest.approx((0.0, vmax))


def test_token_labels_only_on_outer_axes(small):
    axes = [im.axes for im in images(model_view(small))]  # 3 × 4
    ylabels = [[t.get_text() for t in ax.get_yticklabels()] for ax in axes]
    xlabels = [[t.get_text() for t in ax.get_xticklabels()] for ax in axes]
    for i in range(12):
        left, bottom = i % 4 == 0, i // 4 == 2
        assert ylabels[i] == (["q0", "q1", "q2", "q3"] if left else [])
        assert xlabels[i] == (list("abcde") if bottom else [])
    assert [axes[i].get_ylabel() for i in (0, 4, 8)] == ["L-a", "L-b", "L-c"]
    assert [axes[i].get_title() for i in range(4)] == ["head 0", "head 1", "head 2", "head 3"]


def test_select_layers_and_heads(small):
    fig = model_view(small, layers=[2], heads=[3, 1])
    imgs = images(fig)
    assert len(imgs) == 2
    np.testing.assert_allclose(imgs[1].get_array(), small.maps[2, 1].numpy(), rtol=1e-6)
    assert [im.axes.get_title() for im in imgs] == ["head 3", "head 1"]
    assert imgs[0].axes.get_ylabel() == "L-c"


def test_pool_means_queries_and_sums_keys():
    data = torch.arange(5.0).reshape(1, 1, 5, 1).expand(1, 1, 5, 2)  # row i = [i, i]
    pooled, labels, block = _pool(data, list("abcde"), dim=2, max_blocks=2, op="mean")
    assert block == 3 and pooled.shape == (1, 1, 2, 2)
    torch.testing.assert_close(pooled[0, 0, :, 0], torch.tensor([1.0, 3.5]))  # (0+1+2)/3, (3+4)/2
    assert labels == ["0–2 a…", "3–4 d…"]
    keys, _, _ = _pool(torch.ones(1, 1, 1, 5), list("abcde"), dim=3, max_blocks=2, op="sum")
    torch.testing.assert_close(keys[0, 0, 0], torch.tensor([3.0, 2.0]))
    same, names, one = _pool(data, list("abcde"), dim=2, max_blocks=5, op="mean")
    assert same is data and names == list("abcde") and one == 1


def test_long_input_is_pooled_and_stated_in_title():
    m = AttentionMaps([f"t{i}" for i in range(200)], probs(1, 2, 200, 200))
    fig = model_view(m, max_tokens=50)
    arr = np.asarray(images(fig)[0].get_array())
    assert arr.shape == (50, 50)
    np.testing.assert_allclose(arr.sum(-1), 1.0, rtol=1e-5)  # pooled rows stay distributions
    title = fig._suptitle.get_text()
    assert "200 queries × 200 keys" in title and "pooled to 50 × 50" in title
    assert "max_tokens=50" in title


def test_png_pixel_size_is_bounded_for_512_tokens(tmp_path):
    L, H, N = 6, 12, 512
    m = AttentionMaps([f"tok{i}" for i in range(N)], probs(L, H, N, N))
    path = save_model_view(m, tmp_path / "big.png")
    w, h = Image.open(path).size
    assert w <= 2200 and h <= 2000  # the caps: 22 x 20 inches at 100 dpi
    assert path.stat().st_size < 5_000_000


def test_save_model_view_writes_png_atomically_and_forwards_kwargs(tmp_path, small):
    path = save_model_view(small, tmp_path / "out" / "mv.png", layers=0, heads=[0])
    assert path == tmp_path / "out" / "mv.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["mv.png"]
    small_w = Image.open(path).size[0]
    assert Image.open(save_model_view(small, tmp_path / "all.png")).size[0] > small_w


def test_no_pyplot_figures_are_left_open(small):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    model_view(small)
    assert plt.get_fignums() == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"layers": 3}, "layers: index 3"),
        ({"heads": [9]}, "heads"),
    ],
)
def test_bad_arguments(small, kwargs, match):
    with pytest.raises(ValueError, match=match):
        model_view(small, **kwargs)
    with pytest.raises(ValueError, match="maps: expected AttentionMaps"):
        model_view(small.maps)  # type: ignore[arg-type]
