"""Hugging Face SwinModel (random weights, small configs, offline) <-> attnkit SwinModel."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit import record_attention  # noqa: E402
from attnkit.convert import hf_swin as hs  # noqa: E402
from tests.convert.helpers import rand, randomize  # noqa: E402


def hf_swin_model(image=32, depths=(2, 2), heads=(2, 4), window=4, pooling=True, **kwargs):
    config = transformers.SwinConfig(
        image_size=image,
        patch_size=2,
        embed_dim=16,
        depths=list(depths),
        num_heads=list(heads),
        window_size=window,
        attn_implementation="eager",
        **kwargs,
    )
    return randomize(transformers.SwinModel(config, add_pooling_layer=pooling))


CASES = {
    # grids 16, 8 (multiples of M=4): no padding, odd blocks shifted
    "16-8-even": dict(image=32),
    # eps that differs from the embedding / merging norms' fixed 1e-5; no q/k/v biases
    "16-8-eps-no-qkv-bias": dict(image=32, layer_norm_eps=1e-3, qkv_bias=False),
    # grids 14, 7: both padded to multiples of 4 (pad_attends), absolute positions
    "14-7-odd": dict(image=28, use_absolute_embeddings=True),
    # grids 16, 8, 4: the last stage's grid equals M, so HF turns its shift off
    "16-8-4-last-is-window": dict(image=32, depths=(2, 2, 2), heads=(2, 4, 4)),
    # grids 9, 5 with M=3: merging pads 9 -> 10; stage 1 pads 5 -> 6, shifted
    "9-5-odd-merge": dict(image=18, window=3),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_swin_model_matches_hidden_states_attentions_and_pooler(case):
    torch.set_num_threads(1)
    model = hf_swin_model(**CASES[case])
    swin = hs.swin_from_hf(model).eval()
    assert swin.config.pad_attends and swin.config.pool
    image = swin.config.image_size
    pixels = rand(2, 3, image, image)
    hf_maps = []  # every SwinLayer's weights (HF's `attentions` keep only each stage's last)
    hooks = [
        layer.register_forward_hook(lambda m, a, out: hf_maps.append(out[1]))
        for stage in model.encoder.layers
        for layer in stage.blocks
    ]
    with torch.no_grad():
        want = model(pixels, output_hidden_states=True, output_attentions=True)
        with record_attention(swin) as rec:
            maps = swin.stage_maps(pixels)
        last, pooled = swin.features(pixels), swin(pixels)
    for h in hooks:
        h.remove()
    # HF's shift rule, reproduced: stages whose grid is not larger than M never shift
    for stage, hf_stage in zip(swin.stages, model.encoder.layers, strict=True):
        for block, layer in zip(stage.blocks, hf_stage.blocks, strict=True):
            assert block.attn.fn.shift == int(layer.shift_size)
            assert block.attn.fn.window_size == int(layer.window_size)
    assert len(maps) == len(want.hidden_states) == len(swin.stages) + 1
    for got, ref in zip(maps, want.hidden_states, strict=True):
        torch.testing.assert_close(got.flatten(1, 2), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(last, want.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(pooled, want.pooler_output, atol=1e-5, rtol=0)
    assert len(rec.names) == len(hf_maps) == sum(swin.config.depths)
    for name, ref in zip(rec.names, hf_maps, strict=True):
        torch.testing.assert_close(rec[name], ref, atol=1e-5, rtol=0)  # (B·nW, Hh, M², M²)
    for s, ref in enumerate(want.attentions):
        depth = swin.config.depths[s]
        torch.testing.assert_close(
            rec[f"stages.{s}.blocks.{depth - 1}.attn.fn.attn"], ref, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("case", ["16-8-even", "14-7-odd"])
def test_swin_model_round_trip_is_bit_identical(case):
    model = hf_swin_model(**CASES[case])
    swin = hs.swin_from_hf(model)
    back = hs.hf_swin_model_state(swin)
    theirs = model.state_dict()
    assert set(back) == set(theirs)
    for k, v in theirs.items():
        assert back[k].shape == v.shape and torch.equal(back[k], v), k
    fresh = hf_swin_model(**CASES[case])
    fresh.load_state_dict(back, strict=True)
    again = hs.hf_swin_model_state(hs.swin_from_hf(fresh))
    assert all(torch.equal(again[k], v) for k, v in theirs.items())


def test_swin_model_without_pooler_returns_tokens():
    torch.set_num_threads(1)
    model = hf_swin_model(pooling=False)
    swin = hs.swin_from_hf(model).eval()
    assert not swin.config.pool
    pixels = rand(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(swin(pixels), model(pixels).last_hidden_state, atol=1e-5, rtol=0)


def test_swin_model_state_that_does_not_fit_and_refusals():
    model = hf_swin_model()
    swin = hs.swin_from_hf(model)
    state = dict(model.state_dict())
    key = "encoder.layers.0.downsample.reduction.weight"
    state[key] = state[key][:, :10]
    del state["layernorm.bias"]
    state["embeddings.mask_token"] = torch.zeros(1, 1, 16)
    with pytest.raises(ValueError) as err:
        hs.load_hf_swin_model_state(swin, state)
    msg = str(err.value)
    assert f"'{key}' has shape (32, 10), wanted (32, 64)" in msg
    assert "missing 'layernorm.bias' (wanted (32,))" in msg
    assert "unexpected 'embeddings.mask_token' (1, 1, 16)" in msg
    with pytest.raises(ValueError, match="smaller than window_size=4"):
        hs.swin_from_hf(hf_swin_model(image=16, depths=(2, 2, 2), heads=(2, 4, 4)))  # 8, 4, 2
    with pytest.raises(ValueError, match="image_size=30 is not a multiple of patch_size=4"):
        hs.swin_config_from_hf(transformers.SwinConfig(image_size=30, patch_size=4), pool=True)
    with pytest.raises(ValueError, match="expected a transformers SwinModel"):
        hs.swin_from_hf(torch.nn.Linear(2, 2))
