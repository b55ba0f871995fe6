import pytest
import torch

from attnkit.models.vit import ViT, ViTConfig
from attnkit.viz.rollout import attention_rollout, explain_images, plot_explanations, token_map


def _random_maps(l, b, h, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(l, b, h, n, n, generator=g, dtype=torch.float64), -1)


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard", [0.0, 0.5, 0.9])
def test_rollout_rows_sum_to_one(fusion, discard):
    r = attention_rollout(_random_maps(3, 2, 4, 7), head_fusion=fusion, discard_ratio=discard)
    assert r.shape == (2, 7, 7)
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 7, dtype=torch.float64))
    assert (r >= 0).all()


def test_one_layer_no_discard_is_half_attention_plus_identity():
    maps = _random_maps(1, 2, 3, 5)
    a = maps[0].mean(1)  # (B, N, N)
    torch.testing.assert_close(attention_rollout(maps), (a + torch.eye(5)) / 2)


def test_rollout_multiplies_layers_first_on_the_right():
    maps = _random_maps(2, 1, 2, 4, seed=3)
    a1, a2 = ((m.mean(1) + torch.eye(4)) / 2 for m in maps)
    torch.testing.assert_close(attention_rollout(maps), a2 @ a1)
    torch.testing.assert_close(attention_rollout(list(maps)), a2 @ a1)


def test_discard_zeroes_smallest_off_diagonal_entries():
    a = torch.tensor([[[[0.5, 0.1, 0.4], [0.2, 0.2, 0.6], [0.05, 0.15, 0.8]]]], dtype=torch.float64)
    r = attention_rollout(a[None], discard_ratio=0.34)  # drop 1 of 3 per row, never the diagonal
    kept = torch.tensor([[0.5, 0.0, 0.4], [0.0, 0.2, 0.6], [0.0, 0.15, 0.8]], dtype=torch.float64)
    ref = kept + torch.eye(3)
    torch.testing.assert_close(r[0], ref / ref.sum(-1, keepdim=True))


def test_token_map_shapes():
    rows = torch.rand(2, 3, 17, 17)
    assert token_map(rows, (4, 4), class_token=True).shape == (2, 3, 4, 4)
    assert token_map(rows[..., 1:, 1:], (4, 4), class_token=False).shape == (2, 3, 4, 4)
    with pytest.raises(ValueError, match="grid 3×3 needs 9 patch tokens"):
        token_map(rows, (3, 3), class_token=True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"head_fusion": "median"}, "head_fusion must be one of"),
        ({"discard_ratio": 1.0}, r"\[0, 1\)"),
    ],
)
def test_rollout_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention_rollout(_random_maps(1, 1, 1, 3), **kwargs)


def test_explain_images_and_png(tmp_path):
    torch.manual_seed(0)
    model = ViT(ViTConfig(dim=16, depth=2, num_heads=2))
    images, labels = torch.randn(3, 1, 8, 8), torch.tensor([1, 2, 3])
    expl = explain_images(model, images, grid=model.grid, class_token=True)
    assert expl.heads.shape == (3, 2, 4, 4) and expl.rollout.shape == (3, 4, 4)
    assert expl.logits.shape == (3, 10)
    path = plot_explanations(images[:, 0], expl, labels, tmp_path / "sub" / "a.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["a.png"]  # no temporary left behind
