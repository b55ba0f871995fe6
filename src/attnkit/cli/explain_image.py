"""`attnkit explain-image --checkpoint DIR`: class-token attention and rollout on test digits."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli.train import cli_errors, load_run

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "explain-image",
        help="attention maps of a trained ViT / T2T-ViT on test digits (PNG)",
        description="Per-head class-token attention of the last layer and attention rollout "
        "(Abnar & Zuidema 2020) over all layers, laid over test images.",
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="run directory of `train`")
    p.add_argument("--out", type=Path, default=None, help="output directory, default the run's")
    p.add_argument("--images", type=int, default=6, help="how many test images (default 6)")
    p.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean")
    p.add_argument("--discard-ratio", type=float, default=0.0, help="rollout discard, [0, 1)")
    p.set_defaults(run=run_explain_image)


@cli_errors("explain-image")
def run_explain_image(args: argparse.Namespace) -> int:
    from attnkit.models.vit import ViT
    from attnkit.train.data import load_digits
    from attnkit.viz.rollout import explain_images, plot_explanations

    if args.images < 1:
        raise ValueError(f"--images must be >= 1, got {args.images}")
    model, info = load_run(args.checkpoint)
    if not isinstance(model, ViT):
        raise ValueError(
            f"--checkpoint: {args.checkpoint} holds a {type(model).__name__} "
            f"(preset {info['preset']!r}); explain-image needs a ViT or T2T-ViT run"
        )
    data = load_digits()
    images, labels = data.test[: args.images]  # (B, 1, 8, 8), (B,)
    expl = explain_images(
        model,
        images,
        grid=model.grid,
        class_token=model.class_token,
        head_fusion=args.head_fusion,
        discard_ratio=args.discard_ratio,
    )
    out = (args.out or args.checkpoint) / "attention.png"
    what = "class-token" if model.class_token else "mean-query"
    title = f"{info['preset']}: rollout ({args.head_fusion}) and last-layer {what} attention"
    plot_explanations(data.to_pixels(images)[:, 0], expl, labels, out, title=title)
    acc = float((expl.logits.argmax(-1) == labels).float().mean())
    stats = _head_stats(model, data.test.tensors[0])
    print("what the heads do over all test images (distance in pixels, entropy):")
    print("\n".join("  " + line for line in stats.summary(unit="px")))
    distances = (args.out or args.checkpoint) / "head_distance.png"
    _save_distances(stats, distances, info["preset"])
    print(
        f"wrote {out} ({len(labels)} test images, {acc:.0%} predicted correctly) "
        f"and {distances.name}"
    )
    return 0


def _head_stats(model, images):
    """Mean attention distance (pixels) and entropy per layer and head over `images`."""
    import torch

    from attnkit.analysis.heads import grid_positions, head_stats
    from attnkit.viz.record import record_attention

    with torch.no_grad(), record_attention(model) as rec:
        model(images)
    maps = rec.stack("blocks.")  # (L, B, H, N, N)
    grid_h, grid_w = model.grid
    pixels_per_patch = images.shape[-1] / grid_w
    positions = grid_positions(grid_h, grid_w, pixels_per_patch, prefix=int(model.class_token))
    return head_stats(maps, positions=positions)


def _save_distances(stats, path: Path, preset: str) -> None:
    from attnkit._io import atomic_save_figure
    from attnkit.viz.head_plots import head_distance_figure

    title = f"{preset}: mean attention distance per head (pixels; class-token queries left out)"
    atomic_save_figure(path, head_distance_figure(stats, unit="pixels", title=title))
