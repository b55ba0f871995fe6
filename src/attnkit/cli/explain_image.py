"""`attnkit explain-image --checkpoint DIR`: class-token attention and rollout on test digits."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli._common import (
    add_out_options,
    add_report_options,
    default_out,
    emit,
    positive_int,
    prepare_out,
    progress,
)
from attnkit.cli._errors import UsageError
from attnkit.cli._threads import add_threads, torch_threads
from attnkit.cli.train import cli_errors, load_run

__all__ = ["register"]

FILES = ("attention.png", "head_distance.png")

EPILOG = """\
examples:
  attnkit explain-image --checkpoint runs/vit --images 4
  attnkit explain-image --checkpoint runs/vit --head-fusion max --discard-ratio 0.9 --force

The run comes from e.g. `attnkit train vit --out runs/vit`.
exit codes: 0 done, 2 bad usage (e.g. a CNN run, not a ViT), 130 interrupted (Ctrl-C)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "explain-image",
        help="attention maps of a trained ViT / T2T-ViT on test digits (PNG)",
        description="Draw where a ViT or T2T-ViT trained with `attnkit train` looks: per\n"
        "head, the attention of the class token (or the mean query) in the last layer, and\n"
        "attention rollout over all layers (Abnar & Zuidema 2020), laid over test digits;\n"
        "then how far each head looks (mean attention distance in pixels).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=default_out("train"),
        metavar="DIR",
        help=f"folder of an `attnkit train vit|vit-mean|t2t` run (default: {default_out('train')})",
    )
    add_out_options(p, "explain-image", "attention.png and head_distance.png")
    p.add_argument(
        "--images",
        type=positive_int,
        default=6,
        metavar="K",
        help="how many test digits to draw, one row each (default 6)",
    )
    p.add_argument(
        "--head-fusion",
        choices=("mean", "max", "min"),
        default="mean",
        help="how rollout merges the heads of a layer (default: mean)",
    )
    p.add_argument(
        "--discard-ratio",
        type=float,
        default=0.0,
        metavar="R",
        help="rollout drops this fraction of the weakest attention weights per layer, "
        "0 <= R < 1 (default 0: keep all)",
    )
    add_report_options(p)
    add_threads(p)
    p.set_defaults(run=run_explain_image)


@cli_errors("explain-image")
def run_explain_image(args: argparse.Namespace) -> int:
    if not 0.0 <= args.discard_ratio < 1.0:
        raise UsageError(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    bar = progress(4, "explain-image", quiet=args.quiet)
    with bar:
        bar.set_postfix_str("loading", refresh=False)
        from attnkit.models.vit import ViT
        from attnkit.train.data import load_digits
        from attnkit.viz.rollout import explain_images, plot_explanations

        model, info = load_run(args.checkpoint)
        if not isinstance(model, ViT):
            raise UsageError(
                f"--checkpoint: {args.checkpoint} holds a {type(model).__name__} "
                f"(preset {info['preset']!r}); explain-image needs a ViT or T2T-ViT run"
            )
        out = prepare_out(args.out, FILES, force=args.force)  # after the checks, before work
        data = load_digits()
        images, labels = data.test[: args.images]  # (B, 1, 8, 8), (B,)
        bar.update()
        bar.set_postfix_str("attention maps", refresh=False)
        with torch_threads(args.threads):
            expl = explain_images(
                model,
                images,
                grid=model.grid,
                class_token=model.class_token,
                head_fusion=args.head_fusion,
                discard_ratio=args.discard_ratio,
            )
            bar.update()
            bar.set_postfix_str("head statistics", refresh=False)
            stats = _head_stats(model, data.test.tensors[0])
        bar.update()
        bar.set_postfix_str("drawing", refresh=False)
        # Both pictures are drawn only now that everything is computed; each is written
        # atomically, so Ctrl-C leaves whole files only.
        what = "class-token" if model.class_token else "mean-query"
        title = f"{info['preset']}: rollout ({args.head_fusion}) and last-layer {what} attention"
        attention, distances = (out / name for name in FILES)
        plot_explanations(data.to_pixels(images)[:, 0], expl, labels, attention, title=title)
        _save_distances(stats, distances, info["preset"])
        bar.update()
    correct = int((expl.logits.argmax(-1) == labels).sum())
    if not (args.quiet or args.json):
        print("what the heads do over all test images (distance in pixels, entropy):")
        print("\n".join("  " + line for line in stats.summary(unit="px")))
    summary = {
        "checkpoint": str(args.checkpoint),
        "model": info["preset"],
        "images": len(labels),
        "correct": correct,
        "head_distance_px": stats.distance.tolist(),  # (L, H)
        "head_entropy_nats": stats.entropy.tolist(),  # (L, H)
        "out": str(out),
        "files": [str(attention), str(distances)],
    }
    line = (
        f"drew {info['preset']} attention on {len(labels)} test digits ({correct} predicted "
        f"correctly); wrote {', '.join(FILES)} to {out}/"
    )
    emit(args, "explain-image", summary, line)
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
