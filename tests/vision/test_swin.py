"""attnkit.vision.swin: PatchMerging, SwinStage, SwinModel (no Hugging Face needed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit import record_attention
from attnkit.vision import PatchMerging, SwinConfig, SwinModel, SwinStage, stage_window


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_patch_merging_order_and_odd_padding():
    merge = PatchMerging(2)
    with torch.no_grad():
        merge.norm.weight.fill_(1.0)
        merge.norm.bias.zero_()
    x = rand(1, 5, 3, 2)  # odd both ways: padded to 6 × 4
    y = merge(x)
    assert y.shape == (1, 3, 2, 4)
    # the 4C vector at (0, 0) is x[0,0], x[1,0], x[0,1], x[1,1]
    cat = torch.cat([x[0, 0, 0], x[0, 1, 0], x[0, 0, 1], x[0, 1, 1]])
    want = merge.reduction(merge.norm(cat))
    torch.testing.assert_close(y[0, 0, 0], want)
    # bottom-right neighbourhood holds one real token and three zeros
    cat = torch.cat([x[0, 4, 2], torch.zeros(6)])
    torch.testing.assert_close(y[0, 2, 1], merge.reduction(merge.norm(cat)))
    with pytest.raises(ValueError, match=r"shape \(B, H, W, 2\), got \(1, 4, 4, 3\)"):
        merge(rand(1, 4, 4, 3))


@pytest.mark.parametrize(
    ("grid", "window", "want"),
    [
        ((8, 8), 4, (4, True)),
        ((4, 4), 4, (4, False)),
        ((3, 6), 4, (3, False)),
        ((5, 9), 4, (4, True)),
    ],
)
def test_stage_window_rule(grid, window, want):
    assert stage_window(grid, window) == want


def test_swin_stage_shifts_downsamples_and_checks_grid():
    stage = SwinStage(8, 3, 2, 4, grid=(9, 7), downsample=True)
    assert [b.attn.fn.shift for b in stage.blocks] == [0, 2, 0]
    assert stage.out_grid == (5, 4)
    assert stage(rand(2, 9, 7, 8)).shape == (2, 5, 4, 16)
    small = SwinStage(8, 2, 2, 4, grid=(4, 6))
    assert [b.attn.fn.shift for b in small.blocks] == [0, 0] and small.window_size == 4
    assert small(rand(1, 4, 6, 8)).shape == (1, 4, 6, 8)
    with pytest.raises(ValueError, match=r"shape \(B, 9, 7, C\), got \(2, 7, 9, 8\)"):
        stage(rand(2, 7, 9, 8))
    with pytest.raises(ValueError, match="depth must be a positive integer, got 0"):
        SwinStage(8, 0, 2, 4, grid=(8, 8))


def test_swin_model_shapes_records_and_trains():
    torch.set_num_threads(1)
    cfg = SwinConfig(
        image_size=28, patch_size=2, embed_dim=8, depths=(2, 1), num_heads=(2, 2), window_size=4
    )
    assert cfg.grids == [(14, 14), (7, 7)] and cfg.num_features == 16
    model = SwinModel(cfg)
    x = rand(2, 3, 28, 28)
    with record_attention(model) as rec:
        out = model(x)
    assert out.shape == (2, 16)
    assert model.features(x).shape == (2, 49, 16)
    assert [m.shape for m in model.stage_maps(x)] == [(2, 14, 14, 8), (2, 7, 7, 16), (2, 7, 7, 16)]
    # 14 × 14 pads to 16 × 16: 16 windows of 4 × 4 per image
    assert rec["stages.0.blocks.0.attn.fn.attn"].shape == (32, 2, 16, 16)
    assert rec["stages.1.blocks.0.attn.fn.attn"].shape == (8, 2, 16, 16)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    tokens = SwinModel(cfg.replace(pool=False, absolute_pos=True))
    assert tokens.pos.shape == (1, 196, 8) and tokens(x).shape == (2, 49, 16)


def test_swin_config_errors():
    with pytest.raises(ValueError, match="same non-zero length, got 2 and 1"):
        SwinConfig(depths=(2, 2), num_heads=(2,))
    with pytest.raises(ValueError, match="patch_size must divide image_size=30, got patch_size=4"):
        SwinConfig(image_size=30)
    with pytest.raises(ValueError, match=r"num_heads\[1\] must divide the stage width 16, got 5"):
        SwinConfig(embed_dim=8, depths=(1, 1), num_heads=(2, 5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        SwinConfig().window_size = 3
