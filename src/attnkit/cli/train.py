"""`attnkit train vit|t2t|cnn` and `attnkit eval --checkpoint DIR` on the 8×8 digits."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["cli_errors", "load_run", "register"]

DEFAULT_OUT = Path("attnkit-out")
# The names of attnkit.models.vit.PRESETS, spelled here so that the parser is built
# without importing torch (a test keeps the two equal).
PRESET_NAMES = ("cnn", "t2t", "vit", "vit-mean")


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


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a ViT, T2T-ViT or CNN+CBAM on the 8×8 digits",
        description="Train on scikit-learn's 8×8 digits (fixed stratified split, offline). "
        "Under `torchrun --nproc_per_node N -m attnkit train ...` the run is data-parallel.",
    )
    p.add_argument("model", choices=PRESET_NAMES, help="model preset")
    recipe = "default: the model's recipe in attnkit.train.data.DIGITS_RECIPES"
    p.add_argument("--epochs", type=int, default=None, help=recipe)
    p.add_argument("--batch-size", type=int, default=None, help="global batch; " + recipe)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate; " + recipe)
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps (smoke runs)")
    p.add_argument("--seed", type=int, default=0, help="model init, data order, augmentation")
    p.add_argument(
        "--out", type=Path, default=None, help="run directory, default attnkit-out/MODEL"
    )
    p.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads per process (default 1: these models are small, and on a "
        "shared CPU more threads mostly wait on each other)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar or epoch lines")
    p.set_defaults(run=run_train)

    e = subparsers.add_parser("eval", help="test accuracy of a run directory")
    e.add_argument("--checkpoint", type=Path, required=True, help="run directory of `train`")
    e.set_defaults(run=run_eval)


@cli_errors("train")
def run_train(args: argparse.Namespace) -> int:
    import torch

    from attnkit.models.vit import PRESETS, build_model
    from attnkit.train.data import (
        DIGITS_RECIPES,
        classify_step,
        evaluate_classifier,
        load_digits,
        random_shift,
    )
    from attnkit.train.loop import TrainingDiverged, distributed, fit, read_checkpoint

    for name in ("epochs", "batch_size", "lr", "max_steps", "threads"):
        value = getattr(args, name)
        if value is not None and not (0 < value < float("inf")):
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    out = args.out or DEFAULT_OUT / args.model
    recipe = DIGITS_RECIPES[args.model]
    given = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr") if getattr(args, k)}
    config = dataclasses.replace(recipe, seed=args.seed, max_steps=args.max_steps, **given)
    model_config = PRESETS[args.model]
    if args.resume:  # a missing or foreign checkpoint fails here, before the data is loaded
        if not (out / "checkpoint.pt").is_file():
            raise ValueError(f"resume: no checkpoint in {out} (--resume): train without it first")
        read_checkpoint(out / "checkpoint.pt")
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
    with distributed() as device:
        started = time.perf_counter()
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
                progress=not args.no_progress,
            )
        except KeyboardInterrupt:
            print(
                f"attnkit train: interrupted; the last good checkpoint is in {out}", file=sys.stderr
            )
            return 130
        except TrainingDiverged as e:
            print(f"attnkit train: error: {e} (files in {out})", file=sys.stderr)
            return 1
        seconds = time.perf_counter() - started
        rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if rank0 and result.history:
        last = result.history[-1]
        print(
            f"{args.model}: test accuracy {last['test_acc']:.2%}  params {result.params:,}  "
            f"train time {seconds:.1f}s  ({out})"
        )
    return 0


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
    from attnkit.train.data import evaluate_classifier, load_digits

    model, info = load_run(args.checkpoint)
    metrics = evaluate_classifier(model, load_digits().test)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{info['preset']}: test accuracy {metrics['test_acc']:.2%}  "
        f"test loss {metrics['test_loss']:.4f}  params {params:,}"
    )
    return 0
