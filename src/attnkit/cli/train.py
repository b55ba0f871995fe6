"""`attnkit train vit|t2t|cnn` and `attnkit eval` on the 8×8 digits."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    add_max_steps,
    add_max_time,
    add_out_options,
    add_report_options,
    default_out,
    emit,
    positive_int,
    prepare_out,
    remove_results,
    seed_number,
    thread_count,
)
from attnkit.cli._errors import UsageError
from attnkit.cli._threads import add_threads, torch_threads

if TYPE_CHECKING:
    import torch

__all__ = ["RECIPES", "cli_errors", "load_run", "register"]

# attnkit.models.vit.PRESETS and attnkit.train.data.DIGITS_RECIPES (epochs, batch, peak lr),
# spelled here so that the parser is built without importing torch (a test keeps them equal).
RECIPES = {
    "cnn": (30, 32, 3e-3),
    "t2t": (40, 32, 2e-3),
    "vit": (100, 32, 2e-3),
    "vit-mean": (60, 32, 2e-3),
}
PRESET_NAMES = tuple(RECIPES)
RUN_FILES = ("checkpoint.pt", "metrics.json", "config.json")
EVAL_FILES = ("eval.json",)

TRAIN_EPILOG = """\
examples:
  attnkit train cnn
  attnkit train vit --out runs/vit --epochs 20
  attnkit train vit --out runs/vit --epochs 30 --resume
  attnkit train vit --out runs/long --max-time 600
  attnkit train vit --out runs/long --resume
  attnkit train t2t --out runs/t2t --json

Files (each replaced atomically, so Ctrl-C keeps the last finished epoch): checkpoint.pt,
metrics.json, config.json; --max-time writes them at the step where it stops, inside an
epoch. Data-parallel: torchrun --nproc_per_node 2 -m attnkit train vit.
exit codes: 0 done (or stopped by --max-time), 1 training diverged, 2 bad usage,
130 interrupted (Ctrl-C)."""

EVAL_EPILOG = """\
examples:
  attnkit eval
  attnkit eval --checkpoint runs/vit --out runs/vit-eval --json

exit codes: 0 done, 2 bad usage (e.g. not a train run), 130 interrupted (Ctrl-C)."""


def cli_errors(prog: str) -> Callable:
    """Turn ValueError / FileNotFoundError into exit code 2 and one line on stderr."""

    def wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(fn)
        def run(args: argparse.Namespace) -> int:
            try:
                return fn(args)
            except (ValueError, FileNotFoundError) as e:
                print(f"attnkit {prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
                return 2

        return run

    return wrap


def _recipe_help() -> str:
    return ", ".join(f"{name} {r[0]}" for name, r in RECIPES.items())


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a ViT, T2T-ViT or CNN+CBAM on the 8×8 digits",
        description="Train an image model on scikit-learn's 8×8 digits (1,437 training and\n"
        "360 test images, a fixed split; nothing is downloaded), evaluating on the test\n"
        "images after every epoch.",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model",
        choices=PRESET_NAMES,
        help="what to train: vit (ViT with a class token), vit-mean (ViT, mean pooling), "
        "t2t (T2T-ViT) or cnn (a small CNN with CBAM attention gates)",
    )
    p.add_argument(
        "--epochs",
        type=positive_int,
        metavar="E",
        help=f"passes over the training images (default per model: {_recipe_help()})",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="B",
        help="images per optimizer step, over all processes (default 32)",
    )
    p.add_argument(
        "--lr",
        type=float,
        metavar="LR",
        help="peak learning rate of AdamW, reached after a 5%% warm-up, then cosine decay "
        "(default: cnn 0.003, the others 0.002)",
    )
    add_max_steps(p)
    add_max_time(p)
    p.add_argument(
        "--seed",
        type=seed_number,
        default=0,
        help="seed of the initial weights, data order and augmentation (default 0)",
    )
    add_out_options(p, "train", "checkpoint.pt, metrics.json and config.json")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out where it stopped (--max-steps, --max-time, Ctrl-C) "
        "until --epochs (or --max-steps) are done (same model and --seed)",
    )
    p.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        metavar="T",
        help="CPU threads per process (default 1: these models are small, and on a "
        "shared CPU more threads mostly wait on each other)",
    )
    add_report_options(p)
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar and no per-epoch lines on stderr (--quiet implies it)",
    )
    p.set_defaults(run=run_train)

    e = subparsers.add_parser(
        "eval",
        help="test accuracy of a trained model",
        description="Evaluate a model trained with `attnkit train` on the 360 test digits\n"
        "and write the result to eval.json.",
        epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument(
        "--checkpoint",
        type=Path,
        default=default_out("train"),
        metavar="DIR",
        help=f"folder of an `attnkit train` run (default: {default_out('train')})",
    )
    add_out_options(e, "eval", "eval.json")
    add_report_options(e)
    add_threads(e)
    e.set_defaults(run=run_eval)


def _check_numbers(args: argparse.Namespace) -> None:
    if args.lr is not None and not (0 < args.lr < float("inf")):
        raise UsageError(f"--lr must be a number > 0, got {args.lr}")
    if args.resume and args.force:
        raise UsageError(
            "--resume continues the run in --out and --force replaces it: pass one of them"
        )


@cli_errors("train")
def run_train(args: argparse.Namespace) -> int:
    _check_numbers(args)
    out = args.out
    if args.resume:  # a missing or foreign checkpoint fails here, before the data is loaded
        from attnkit.train.loop import read_checkpoint

        if not (out / "checkpoint.pt").is_file():
            raise UsageError(f"resume: no checkpoint in {out} (--resume): train without it first")
        read_checkpoint(out / "checkpoint.pt")
        prepare_out(out, ())  # the folder is this run's until it ends
    else:
        # Under torchrun only rank 0 judges the folder: the others may start after rank 0
        # has written config.json into it.
        prepare_out(out, RUN_FILES, force=args.force or not _first_rank())

    import torch

    from attnkit.models.vit import PRESETS, build_model
    from attnkit.train.data import (
        DIGITS_RECIPES,
        classify_step,
        evaluate_classifier,
        load_digits,
        random_shift,
    )
    from attnkit.train.loop import TrainingDiverged, distributed, fit

    recipe = DIGITS_RECIPES[args.model]
    given = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr") if getattr(args, k)}
    config = dataclasses.replace(
        recipe, seed=args.seed, max_steps=args.max_steps, max_time=args.max_time, **given
    )
    model_config = PRESETS[args.model]
    data = load_digits()
    run_info = {
        "preset": args.model,
        "model_kind": type(model_config).__name__,
        "model": dataclasses.asdict(model_config),
        "data": {"name": "digits", "test_fraction": 0.2, "split_seed": 0},
        "init_seed": args.seed,
    }
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(model_config)
    augment = functools.partial(random_shift, max_shift=1, fill=data.background)
    if args.force and _first_rank():
        remove_results(out, RUN_FILES)  # every check passed: the old run goes now
    with distributed() as device:
        try:
            result = fit(
                model,
                classify_step(augment=augment, label_smoothing=0.1),
                data.train,
                config=config,
                out_dir=out,
                evaluate=lambda m: evaluate_classifier(m, data.test),
                resume=args.resume,
                run_info=run_info,
                device=device,
                progress=not (args.no_progress or args.quiet),
            )
        except KeyboardInterrupt:
            print(
                "attnkit train: interrupted; only complete files were written (the last "
                f"finished epoch is in {out}; --resume continues it)",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        except TrainingDiverged as e:
            print(f"attnkit train: error: {e} (files in {out})", file=sys.stderr)
            return EXIT_FAILURE
        rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if rank0 and (result.history or result.stopped):
        _train_summary(args, out, result)
    return 0


def _first_rank() -> bool:
    """Rank 0 of a torchrun launch, or a plain single process (torchrun sets RANK)."""
    return os.environ.get("RANK", "0") == "0"


def _train_summary(args: argparse.Namespace, out: Path, result) -> None:
    last = result.stopped or result.history[-1]  # a stop inside an epoch is not in history
    summary = {
        "model": args.model,
        "out": str(out),
        "files": [str(out / name) for name in RUN_FILES],
        "epochs": last["epoch"],
        "steps": last["step"],
        "test_acc": last["test_acc"],
        "test_loss": last["test_loss"],
        "train_loss": last["train_loss"],
        "params": result.params,
        "seconds": round(result.seconds, 2),
        "total_steps": result.total_steps,
        "stopped": "max-time" if result.stopped else None,
    }
    if result.stopped:
        line = (
            f"stopped by --max-time at step {last['step']} of {result.total_steps}: test "
            f"accuracy {last['test_acc']:.2%}; wrote {', '.join(RUN_FILES)} to {out}/ "
            "(--resume continues)"
        )
        return emit(args, "train", summary, line)
    line = (
        f"trained {args.model} to epoch {last['epoch']} (step {last['step']}) in "
        f"{result.seconds:.1f} s: test accuracy {last['test_acc']:.2%}, {result.params:,} "
        f"params; wrote {', '.join(RUN_FILES)} to {out}/"
    )
    emit(args, "train", summary, line)


def load_run(directory: Path) -> tuple[torch.nn.Module, dict]:
    """The trained model (eval mode) and run_info of a `train` run directory."""
    from attnkit.models.vit import build_model, config_from_dict
    from attnkit.train.loop import read_checkpoint

    directory = Path(directory)
    if directory.is_file():
        raise ValueError(
            f"--checkpoint {str(directory)!r} is a file: give the folder of an `attnkit train` run"
        )
    path = directory / "checkpoint.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"--checkpoint: no checkpoint.pt in {directory}; run `attnkit train` first"
        )
    try:
        state = read_checkpoint(path)
        info = state["run_info"]
        model = build_model(config_from_dict(info["model_kind"], info["model"]))
        model.load_state_dict(state["model"])
    except (KeyError, TypeError, RuntimeError) as e:
        reason = " ".join(str(e).split())[:100]
        raise ValueError(
            f"--checkpoint: {path} does not hold a model attnkit can build ({reason}); "
            "train it again with `attnkit train`"
        ) from None
    except ValueError as e:
        raise ValueError(f"--checkpoint: {e}") from None
    return model.eval(), info


@cli_errors("eval")
def run_eval(args: argparse.Namespace) -> int:
    from attnkit._io import atomic_write_json
    from attnkit.train.data import evaluate_classifier, load_digits

    model, info = load_run(args.checkpoint)  # checks the checkpoint before --out is touched
    prepare_out(args.out, EVAL_FILES, force=args.force)
    test = load_digits().test
    with torch_threads(args.threads):
        metrics = evaluate_classifier(model, test)
    params = sum(p.numel() for p in model.parameters())
    summary = {
        "model": info["preset"],
        "checkpoint": str(args.checkpoint),
        "test_acc": metrics["test_acc"],
        "test_loss": metrics["test_loss"],
        "test_images": len(test),
        "params": params,
    }
    path = atomic_write_json(args.out / "eval.json", summary)
    line = (
        f"{info['preset']} from {args.checkpoint}: test accuracy {metrics['test_acc']:.2%}, "
        f"test loss {metrics['test_loss']:.4f}, {params:,} params; wrote eval.json to "
        f"{args.out}/"
    )
    emit(args, "eval", {**summary, "files": [str(path)], "out": str(args.out)}, line)
    return 0
