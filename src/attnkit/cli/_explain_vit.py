"""`attnkit explain --checkpoint DIR --image FILE` for a transformers ViT checkpoint.

Dimensions: L layers, H heads, N = 1 + h·w tokens (class token first), I image side.

The pictures of `attnkit explain-image`: attention rollout through all layers and the last
layer's class-token attention per head, laid over the image (attention.png), and the mean
attention distance per head in pixels (head_distance.png, drawn by explain-image's own
function). The model runs on transformers with ``attn_implementation="attnkit"``; weights
that do not fit its config.json (another model's, or a part missing) are refused with one
line naming the folder, exit 1 (`attnkit.cli._explain_hf.checked_model`). Tolerated: a
classifier head when the folder is read as a plain ViTModel, and the pooler.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnkit.cli._common import prepare_out
from attnkit.cli._errors import UsageError
from attnkit.cli._paths import input_file

__all__ = ["FILES", "run"]

FILES = ("attention.png", "head_distance.png")


def _pixels(path: Path, config, folder: Path):
    """The image as the model wants it, (1, C, I, I), and as intensities (1, I, I) to draw on.
    Normalised with preprocessor_config.json's mean / std when the folder has one, else the
    ViT default 0.5 / 0.5."""
    import torch
    from PIL import Image, UnidentifiedImageError

    side, channels = int(config.image_size), int(getattr(config, "num_channels", 3))
    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB" if channels == 3 else "L").resize((side, side))
            gray = img.convert("L").resize((side, side))
    except (OSError, UnidentifiedImageError) as e:
        raise UsageError(f"--image {str(path)!r} is not an image file PIL can read ({e})") from None
    mean, std = [0.5] * channels, [0.5] * channels
    pre = folder / "preprocessor_config.json"
    if pre.is_file():
        settings = json.loads(pre.read_text(encoding="utf-8"))
        mean, std = settings.get("image_mean", mean), settings.get("image_std", std)
    x = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).float() / 255
    x = x.view(side, side, channels).permute(2, 0, 1)  # (I, I, C) -> (C, I, I)
    x = (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    g = torch.frombuffer(bytearray(gray.tobytes()), dtype=torch.uint8).float() / 255
    return x[None], g.view(1, side, side)  # (1, C, I, I), (1, I, I)


def run(args, text_files: tuple[str, ...]) -> int:
    """Explain one image for a ViT checkpoint folder; UsageError for bad input."""
    from attnkit.cli._explain_hf import checked_model, model_type, require_transformers

    folder: Path = args.checkpoint
    if args.image is None:
        raise UsageError(
            f"--checkpoint {str(folder)!r} is an image model ({model_type(folder)!r}): "
            "give the picture to explain with --image FILE (PNG or JPEG)"
        )
    input_file(args.image, "--image", "a PNG or JPEG file")
    hf = require_transformers(folder)
    try:
        config = hf._config(folder)
    except ValueError as e:
        raise UsageError(str(e)) from None
    images, gray = _pixels(args.image, config, folder)
    prepare_out(args.out, FILES + text_files, force=args.force)

    import torch
    import transformers

    from attnkit.analysis.heads import grid_positions, head_stats
    from attnkit.cli.explain_image import _save_distances
    from attnkit.viz.record import record_attention
    from attnkit.viz.rollout import (
        ImageExplanation,
        attention_rollout,
        plot_explanations,
        token_map,
    )

    archs = getattr(config, "architectures", None) or []
    classify = any(a.endswith("ForImageClassification") for a in archs)
    auto = transformers.AutoModelForImageClassification if classify else transformers.AutoModel
    from attnkit.integrations._hf_checkpoint import from_pretrained_checked

    model = checked_model(
        lambda: from_pretrained_checked(auto, folder, attn_implementation="attnkit")
    )
    with torch.no_grad(), record_attention(model.eval()) as rec:
        out = model(pixel_values=images)
    maps = rec.stack()  # (L, 1, H, N, N)
    side = int(config.image_size) // int(config.patch_size)
    grid = (side, side)
    expl = ImageExplanation(
        heads=token_map(maps[-1], grid, class_token=True),  # (1, H, h, w)
        rollout=token_map(attention_rollout(maps), grid, class_token=True),  # (1, h, w)
        logits=getattr(out, "logits", None) if classify else None,
    )
    name = f"{folder.name} ({model_type(folder)})"
    title = f"{name}: rollout (mean) and last-layer class-token attention, {args.image.name}"
    upsample = max(1, 128 // int(config.image_size))
    picture = plot_explanations(
        gray, expl, None, args.out / FILES[0], title=title, upsample=upsample
    )
    positions = grid_positions(side, side, float(config.patch_size), prefix=1)
    stats = head_stats(maps, positions=positions)
    distances = args.out / FILES[1]
    _save_distances(stats, distances, name)
    show = not (args.quiet or args.json)
    if show:
        print(f"{name}: {maps.shape[0]} layers x {maps.shape[2]} heads, {side}x{side} patches")
        print("what the heads do (distance in pixels, entropy):")
        print("\n".join("  " + line for line in stats.summary(unit="px")))
    written = [picture, distances]
    if args.json:
        summary = {
            "command": "explain",
            "checkpoint": str(folder),
            "image": str(args.image),
            "files": [str(p) for p in written],
            "out": str(args.out),
        }
        print(json.dumps(summary))
    else:
        print(f"attnkit explain: wrote {', '.join(p.name for p in written)} to {args.out}/")
    sys.stdout.flush()
    return 0
