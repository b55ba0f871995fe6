"""Worst error of attnkit against each peer it converts from, same weights, float32 CPU.

For every peer: random weights (biases and norms perturbed so that every
parameter counts), odd sizes, masks where the peer takes them, several seeds;
the maximum absolute difference of the outputs (and of the attention maps,
where the peer returns them). Prints a markdown table and writes
benchmarks/results/interop_errors.json. Peers that are not installed are skipped.

    python benchmarks/interop_errors.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import torch
from torch import nn

from attnkit import masks, positional, record_attention
from attnkit.convert import from_keras, from_torch
from attnkit.convert import torch_decoder as td
from attnkit.convert import torch_transformer as tt


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def perturb(module: nn.Module, seed: int, std: float = 0.2) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return module.eval()


def gap(a, b) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def padding(b, n, seed):
    kpm = rand(b, n, seed=seed) > 0.5  # torch polarity: True = padding
    kpm[:, 0] = False
    return kpm


@torch.no_grad()
def torch_mha(seed):
    theirs = perturb(nn.MultiheadAttention(24, 3, batch_first=True), seed)
    ours = from_torch(theirs).eval()
    x, ctx, kpm = rand(2, 7, 24, seed=seed), rand(2, 11, 24, seed=seed + 1), padding(2, 11, seed)
    want, want_w = theirs(x, ctx, ctx, key_padding_mask=kpm, average_attn_weights=False)
    with record_attention(ours) as rec:
        got = ours(x, ctx, mask=masks.from_torch_key_padding_mask(kpm))
    return gap(got, want), gap(rec["attend"], want_w)


@torch.no_grad()
def torch_encoder(seed):
    worst = 0.0
    for norm_first in (False, True):
        layer = nn.TransformerEncoderLayer(24, 3, 40, batch_first=True, norm_first=norm_first)
        theirs = perturb(layer, seed)
        ours = tt.encoder_from_torch(theirs).eval()
        x, kpm = rand(3, 7, 24, seed=seed), padding(3, 7, seed)
        want = theirs(x, src_key_padding_mask=kpm)
        worst = max(worst, gap(ours(x, mask=tt.encoder_mask_from_torch(None, kpm)), want))
    return worst, None


@torch.no_grad()
def torch_decoder(seed):
    worst = 0.0
    for norm_first in (False, True):
        layer = nn.TransformerDecoderLayer(24, 3, 40, batch_first=True, norm_first=norm_first)
        theirs = perturb(layer, seed)
        ours = td.decoder_from_torch(theirs).eval()
        x, memory = rand(3, 7, 24, seed=seed), rand(3, 11, 24, seed=seed + 1)
        kw = dict(
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(7).isinf(),
            tgt_key_padding_mask=padding(3, 7, seed),
            memory_key_padding_mask=padding(3, 11, seed + 1),
        )
        mask, mem = td.decoder_masks_from_torch(**kw)
        got = ours(x, memory, mask=mask, memory_mask=mem)
        worst = max(worst, gap(got, theirs(x, memory, **kw)))
    return worst, None


@torch.no_grad()
def keras_mha(seed):
    import keras
    import numpy as np

    layer = keras.layers.MultiHeadAttention(num_heads=3, key_dim=7)
    layer.build((None, None, 24), (None, None, 36))
    rng = np.random.default_rng(seed)
    for v in layer.weights:
        v.assign((rng.standard_normal(v.shape) * 0.4).astype(v.dtype))
    ours = from_keras(layer).eval()
    x, ctx = rand(2, 7, 24, seed=seed), rand(2, 11, 36, seed=seed + 1)
    am = (rand(2, 7, 11, seed=seed + 2) > -0.6).int()
    am[..., 0] = 1
    want, want_w = layer(x, ctx, attention_mask=am, return_attention_scores=True)
    with record_attention(ours) as rec:
        got = ours(x, ctx, mask=masks.from_keras_attention_mask(am))
    return gap(got, want), gap(rec["attend"], want_w)


def hf_vit(seed):
    import transformers

    from attnkit.convert import hf_vision as hv

    config = transformers.ViTConfig(
        hidden_size=36,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=144,
        image_size=21,
        patch_size=7,
        attn_implementation="eager",
    )
    model = perturb(transformers.ViTModel(config), seed, std=0.1)
    vit = hv.vit_from_hf(model).eval()
    images = rand(2, 3, 21, 21, seed=seed)
    with torch.no_grad():
        want = model(images, output_attentions=True)
        pooled, last = vit(images), vit.features(images)  # the default ("auto") backend
        with record_attention(vit) as rec:
            vit(images)
    maps = max(gap(rec[f"blocks.{i}.attn.fn"], a) for i, a in enumerate(want.attentions))
    return max(gap(pooled, want.pooler_output), gap(last, want.last_hidden_state)), maps


def hf_swin(seed):
    import transformers

    from attnkit.convert import hf_vision as hv

    worst, worst_maps = 0.0, 0.0
    for image in (28, 36):  # 7 × 7 grid (padded to 9 × 9) and 9 × 9, window 3
        config = transformers.SwinConfig(
            image_size=image,
            patch_size=4,
            embed_dim=24,
            depths=[2],
            num_heads=[3],
            window_size=3,
            attn_implementation="eager",
        )
        model = perturb(transformers.SwinModel(config), seed, std=0.1)
        grid = (image // 4,) * 2
        x_hf = rand(2, grid[0] * grid[1], 24, seed=seed)
        x = x_hf.unflatten(1, grid)
        for layer in model.encoder.layers[0].blocks:
            block = hv.swin_block_from_hf(layer, config, grid=grid).eval()
            with torch.no_grad():
                with record_attention(block) as rec:
                    block(x)
                x, (x_hf, w_hf) = block(x), layer(x_hf, grid)
            worst = max(worst, gap(x.flatten(1, 2), x_hf))
            worst_maps = max(worst_maps, gap(rec["attn.fn.attn"], w_hf))
    return worst, worst_maps


def hf_swin_model(seed):
    import transformers

    from attnkit.convert import hf_swin

    worst, worst_maps = 0.0, 0.0
    for image in (32, 28):  # grids 16, 8 and 14, 7 (both padded), window 4, shifted
        config = transformers.SwinConfig(
            image_size=image,
            patch_size=2,
            embed_dim=16,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=4,
            attn_implementation="eager",
        )
        model = perturb(transformers.SwinModel(config), seed, std=0.1)
        swin = hf_swin.swin_from_hf(model).eval()
        images = rand(2, 3, image, image, seed=seed)
        hf_maps = []
        hooks = [
            layer.register_forward_hook(lambda m, a, out, seen=hf_maps: seen.append(out[1]))
            for stage in model.encoder.layers
            for layer in stage.blocks
        ]
        with torch.no_grad():
            want = model(images, output_hidden_states=True)
            with record_attention(swin) as rec:
                maps = swin.stage_maps(images)
            pooled, last = swin(images), swin.features(images)
        for h in hooks:
            h.remove()
        hidden = [gap(m.flatten(1, 2), w) for m, w in zip(maps, want.hidden_states, strict=True)]
        outs = [gap(pooled, want.pooler_output), gap(last, want.last_hidden_state), *hidden]
        worst = max(worst, *outs)
        pairs = zip(rec.names, hf_maps, strict=True)
        worst_maps = max(worst_maps, *(gap(rec[n], w) for n, w in pairs))
    return worst, worst_maps


def hf_detr(seed):
    """DETR's transformer (tiny ResNet backbone, random weights, one padded image): the
    encoder output and every decoder layer's normalised output, on HF's own encoder inputs
    and with the positions recomputed by attnkit's `detr_sine_2d`."""
    import transformers

    from attnkit.convert import hf_detr as hd

    backbone = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
        out_features=["stage2"],
    )  # fmt: skip
    config = transformers.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
        d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_queries=5,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = perturb(transformers.DetrModel(config), seed).eval()
    ours = hd.detr_transformer_from_hf(model, return_intermediate=True).eval()
    seen = {}
    model.encoder.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    pixel_mask = torch.ones(2, 64, 48, dtype=torch.long)
    pixel_mask[1, 40:, :] = 0
    pixel_mask[1, :, 30:] = 0
    with torch.no_grad():
        want = model(rand(2, 3, 64, 48, seed=seed), pixel_mask, output_hidden_states=True)
        hs, memory = ours(
            seen["inputs_embeds"], seen["attention_mask"], seen["spatial_position_embeddings"]
        )
        states = want.decoder_hidden_states  # input, layer outputs, normalised last output
        layers = [model.decoder.layernorm(h) for h in states[1:-1]] + [want.last_hidden_state]
        # and with attnkit's own sine positions, from the (B, 8, 6) mask alone
        mine = positional.detr_sine_2d(seen["attention_mask"].view(2, 8, 6), 32)
        hs2, memory2 = ours(seen["inputs_embeds"], seen["attention_mask"], mine)
    outs = [gap(memory, want.encoder_last_hidden_state), *map(gap, hs, layers)]
    outs += [gap(memory2, want.encoder_last_hidden_state), *map(gap, hs2, layers)]
    return max(outs), None


PEERS = {
    "torch.nn.MultiheadAttention": torch_mha,
    "torch.nn.TransformerEncoderLayer": torch_encoder,
    "torch.nn.TransformerDecoderLayer": torch_decoder,
    "keras.layers.MultiHeadAttention": keras_mha,
    "transformers ViTModel": hf_vit,
    "transformers SwinLayer": hf_swin,
    "transformers SwinModel": hf_swin_model,
    "transformers DetrModel (transformer)": hf_detr,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for name, fn in PEERS.items():
        try:
            results = [fn(seed) for seed in range(args.seeds)]
        except ImportError as err:
            print(f"skip {name}: {err}")
            continue
        maps = [m for _, m in results if m is not None]
        rows[name] = {
            "output": max(o for o, _ in results),
            "weights": max(maps) if maps else None,
        }
    print("| peer | worst output error | worst attention-map error |")
    print("| --- | --- | --- |")
    for name, r in rows.items():
        w = "—" if r["weights"] is None else f"{r['weights']:.1e}"
        print(f"| {name} | {r['output']:.1e} | {w} |")
    out = Path(__file__).parent / "results" / "interop_errors.json"
    out.parent.mkdir(exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"seeds": args.seeds, "torch": torch.__version__, **rows}, indent=2))
    tmp.replace(out)


if __name__ == "__main__":
    main()
