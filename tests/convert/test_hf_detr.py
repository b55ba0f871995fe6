"""Hugging Face DETR (random weights, a tiny ResNet backbone, offline) -> DetrTransformer.

The inputs of HF's encoder (projected feature map, downsampled pixel mask, sine
positions) are caught with a hook on `model.encoder`, so both transformers see
exactly the same tensors; the positions are also recomputed with
`attnkit.positional.detr_sine_2d` from the mask alone.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit import positional  # noqa: E402
from attnkit.convert import hf_detr as hd  # noqa: E402
from attnkit.models import DetrTransformer  # noqa: E402
from tests.convert.helpers import randomize  # noqa: E402

D, HEADS, QUERIES = 32, 4, 5


def hf_model(cls=None, dtype=torch.float32, **kwargs):
    backbone = transformers.ResNetConfig(
        num_channels=3,
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
        out_features=["stage2"],
    )
    settings = dict(
        d_model=D,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        num_queries=QUERIES,
    )
    config = transformers.DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        **(settings | kwargs),
    )
    torch.manual_seed(0)
    model = (cls or transformers.DetrModel)(config)
    return randomize(model, scale=0.2).to(dtype)


def images(dtype=torch.float32):
    """Two images (B, 3, 64, 48); the second is 40 × 30 real pixels, the rest padding."""
    pixels = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(5), dtype=dtype)
    pixel_mask = torch.ones(2, 64, 48, dtype=torch.long)
    pixel_mask[1, 40:, :] = 0
    pixel_mask[1, :, 30:] = 0
    return pixels, pixel_mask


def run_hf(model, dtype=torch.float32):
    """HF's outputs and the inputs its encoder received: src (B, S, C), mask (B, S), pos."""
    seen = {}
    hook = model.encoder.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.update(kwargs), with_kwargs=True
    )
    pixels, pixel_mask = images(dtype)
    with torch.no_grad():
        out = model(pixel_values=pixels, pixel_mask=pixel_mask, output_hidden_states=True)
    hook.remove()
    return out, seen["inputs_embeds"], seen["attention_mask"], seen["spatial_position_embeddings"]


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_encoder_and_decoder_match_hf_with_a_padded_image(dtype, tol):
    model = hf_model(dtype=dtype)
    out, src, keep, pos = run_hf(model, dtype)
    assert keep.dtype == torch.bool and not keep[1].all() and keep[0].all()
    ours = convert(model)
    with torch.no_grad():
        hs, memory = ours(src, keep, pos)
    torch.testing.assert_close(memory, out.encoder_last_hidden_state, atol=tol, rtol=0)
    torch.testing.assert_close(hs[-1], out.last_hidden_state, atol=tol, rtol=0)
    # attnkit's own positions from the (B, h, w) mask: the feature map is 8 × 6
    mine = positional.detr_sine_2d(keep.view(2, 8, 6), D, dtype=dtype)
    torch.testing.assert_close(mine, pos, atol=tol, rtol=0)
    with torch.no_grad():
        hs2, memory2 = ours(src, keep, mine)
    torch.testing.assert_close(memory2, out.encoder_last_hidden_state, atol=tol, rtol=0)
    torch.testing.assert_close(hs2[-1], out.last_hidden_state, atol=tol, rtol=0)


def convert(model, **kwargs):
    ours = hd.detr_transformer_from_hf(model, **kwargs)
    assert isinstance(ours, DetrTransformer)
    return ours.eval()


def test_intermediate_outputs_are_hf_layer_outputs_through_its_final_norm():
    model = hf_model()
    out, src, keep, pos = run_hf(model)
    ours = convert(model, return_intermediate=True)
    with torch.no_grad():
        hs, _ = ours(src, keep, pos)
        # HF's decoder hidden_states: the zero input, each layer's un-normalised output but
        # the last, and (in the last place) the normalised decoder output
        states = out.decoder_hidden_states
        assert len(states) == 4 and torch.equal(states[-1], out.last_hidden_state)
        want = [model.decoder.layernorm(h) for h in states[1:-1]] + [out.last_hidden_state]
    assert hs.shape == (3, 2, QUERIES, D)
    torch.testing.assert_close(hs, torch.stack(want), atol=1e-5, rtol=0)


def test_object_detection_model_converts_and_weights_round_trip():
    model = hf_model(transformers.DetrForObjectDetection)
    ours = convert(model)
    inner = model.model
    torch.testing.assert_close(ours.query_embed.weight, inner.query_position_embeddings.weight)
    # back under HF names: bit-identical to the transformer part of HF's state dict
    prefixes = ("encoder.", "decoder.", "query_position_embeddings.")
    theirs = {k: v for k, v in inner.state_dict().items() if k.startswith(prefixes)}
    back = hd.hf_detr_state(ours)
    assert back.keys() == theirs.keys()
    assert all(torch.equal(back[k], theirs[k]) for k in theirs)


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="activation_function='gelu'"):
        convert(hf_model(activation_function="gelu"))
    with pytest.raises(ValueError, match="decoder_attention_heads=2"):
        convert(hf_model(decoder_attention_heads=2))
    with pytest.raises(ValueError, match="expected a transformers DetrModel"):
        convert(torch.nn.Linear(2, 2))
    ours = DetrTransformer(D, HEADS, 2, 3, 48, 0.0, QUERIES)
    state = hd.hf_detr_state(ours)
    state["decoder.layernorm.weight"] = torch.ones(D + 1)
    del state["query_position_embeddings.weight"]
    with pytest.raises(ValueError, match=r"missing 'query_position_embeddings.weight'.*\(33,\)"):
        hd.load_hf_detr_state(ours, state)
    with pytest.raises(ValueError, match="post-norm"):
        hd.hf_detr_state(DetrTransformer(D, HEADS, 1, 1, 48, 0.0, QUERIES, norm_first=True))
