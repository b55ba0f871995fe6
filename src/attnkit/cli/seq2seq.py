"""`attnkit seq2seq train|decode`: train a Transformer on a synthetic task, run a checkpoint.

    attnkit seq2seq train --task reverse --out runs/reverse
    attnkit seq2seq decode runs/reverse "abcdef" "hgfe"
    torchrun --nproc_per_node 2 -m attnkit seq2seq train --task reverse --out runs/r2

Under torchrun the run is data-parallel (gloo on CPU, nccl on GPU; --batch-size
is the global batch); rank 0 evaluates, writes the files and prints.

`add_seq2seq_parser(train_subparsers)` adds the same training command as
``attnkit train seq2seq`` where a top-level ``train`` exists. Bad input exits
with code 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnkit.cli._common import default_out, positive_int
from attnkit.cli._errors import EXIT_USAGE, UsageError

__all__ = ["add_seq2seq_parser", "register", "run_decode", "run_train"]


def register(subparsers) -> None:
    """Add ``seq2seq`` with its ``train`` and ``decode`` subcommands."""
    parser = subparsers.add_parser(
        "seq2seq",
        help="encoder-decoder Transformer on copy/reverse/sort/add",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=lambda args: _help(parser))
    sub = parser.add_subparsers(dest="seq2seq_command", metavar="COMMAND")
    _add_train(sub.add_parser("train", help="train on a synthetic task"))
    _add_decode(sub.add_parser("decode", help="decode sequences with a trained checkpoint"))


def add_seq2seq_parser(train_subparsers) -> argparse.ArgumentParser:
    """Add ``seq2seq`` under an existing ``attnkit train`` subcommand."""
    parser = train_subparsers.add_parser("seq2seq", help="encoder-decoder Transformer")
    _add_train(parser)
    return parser


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return EXIT_USAGE


# attnkit.seq2seq.tasks.TASKS and the defaults of attnkit.seq2seq.train.TrainConfig, spelled
# here so that the parser is built without importing torch (a test keeps them equal).
TASKS = ("copy", "reverse", "sort", "add")
TRAIN_DEFAULTS = {
    "steps": 1500,
    "batch_size": 64,
    "lr": 1e-3,
    "warmup": 200,
    "eval_every": 250,
    "eval_size": 500,
    "stop_at": 1.0,
    "seed": 0,
}
# Longest sequence a task may ask for: the tiny presets are sized for tens of tokens, and
# attention's memory grows as the square of the length.
MAX_LEN = 512


def _add_train(p: argparse.ArgumentParser) -> None:
    d = argparse.Namespace(**TRAIN_DEFAULTS)
    p.add_argument("--task", choices=TASKS, default="reverse", help="what to learn")
    p.add_argument(
        "--out",
        type=Path,
        default=default_out("seq2seq"),
        metavar="DIR",
        help=f"folder for checkpoint, metrics, pictures (default: {default_out('seq2seq')})",
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--preset", default="tiny", help="model preset (tiny, base, big)")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--pre-norm", dest="norm_first", action="store_true", default=None)
    norm.add_argument("--post-norm", dest="norm_first", action="store_false")
    p.add_argument("--positions", choices=("sinusoidal", "learned"))
    p.add_argument("--label-smoothing", type=float)
    p.add_argument(
        "--steps", "--max-steps", type=int, default=d.steps, help="step budget (schedule length)"
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-size", type=int, default=d.eval_size)
    p.add_argument("--stop-at", type=float, default=d.stop_at, help="stop at this exact match")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--min-len", type=positive_int, default=10, help="shortest sequence (10)")
    p.add_argument(
        "--max-len", type=positive_int, default=20, help=f"longest sequence (20, at most {MAX_LEN})"
    )
    p.add_argument("--num-symbols", type=positive_int, default=16, help="alphabet size (16)")
    p.add_argument("--max-digits", type=positive_int, default=5, help="digits per number (add)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    _add_threads(p)
    p.set_defaults(run=run_train)


def _add_threads(p: argparse.ArgumentParser) -> None:
    # Small models run fastest on one thread; on a shared, loaded CPU two intra-op
    # threads made a training step ~10x slower (0.67 s vs 0.06 s, d_model 64).
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")


def _set_threads(n: int) -> None:
    import torch

    if n < 1:
        raise ValueError(f"--threads must be >= 1, got {n}")
    torch.set_num_threads(n)


def _add_decode(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="a `seq2seq train --out` directory")
    p.add_argument("sequences", nargs="+", help="source sequences, e.g. abcd or '12+7'")
    p.add_argument("--beam", type=int, default=1, help="beam size (1: greedy)")
    p.add_argument("--alignment-dir", type=Path, help="write cross-attention PNGs here")
    _add_threads(p)
    p.set_defaults(run=run_decode)


def run_train(args: argparse.Namespace) -> int:
    from attnkit.seq2seq.tasks import Task
    from attnkit.seq2seq.train import build_model, train, train_config_from
    from attnkit.train.loop import TrainingDiverged, distributed

    if args.max_len > MAX_LEN:
        raise UsageError(f"--max-len {args.max_len} is too long: at most {MAX_LEN} tokens")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {str(args.out)!r} is a file: give a folder")
    try:
        _set_threads(args.threads)
        task = Task(
            args.task,
            min_len=args.min_len,
            max_len=args.max_len,
            num_symbols=args.num_symbols,
            max_digits=args.max_digits,
        )
        overrides = {
            k: getattr(args, k)
            for k in ("norm_first", "positions", "label_smoothing")
            if getattr(args, k) is not None
        }
        cfg = train_config_from(vars(args))
        model_cfg = build_model(task, args.preset, **overrides).cfg
        with distributed() as device:
            _, metrics = train(
                task,
                model_cfg,
                cfg,
                out=args.out,
                resume=args.resume,
                progress=args.progress,
                device=device,
            )
    except ValueError as e:
        raise UsageError(f"train: {e}") from e
    except TrainingDiverged as e:
        print(f"attnkit seq2seq train: error: {e} (files in {args.out})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        where = f"; the last good checkpoint is in {args.out}"
        print(f"attnkit seq2seq train: interrupted{where}", file=sys.stderr)
        return 130
    if metrics:  # rank 0 (the other ranks of a torchrun launch get none)
        print(json.dumps({k: v for k, v in metrics.items() if k != "history"}))
    return 0


def run_decode(args: argparse.Namespace) -> int:
    import torch

    from attnkit.models.decoding import beam_search, greedy
    from attnkit.seq2seq.alignment import write_alignments
    from attnkit.seq2seq.tasks import BOS, EOS, PAD, pad_batch
    from attnkit.seq2seq.train import load_checkpoint

    try:
        _set_threads(args.threads)
        model, task = load_checkpoint(args.checkpoint)
        rows = [[*task.encode(s), EOS] for s in args.sequences]
        if any(len(r) < 2 for r in rows):
            raise ValueError("sequences must not be empty")
        longest = max(len(r) for r in rows)
        if longest > model.cfg.max_len:
            raise ValueError(
                f"sequences have up to {longest} tokens; the model takes at most "
                f"{model.cfg.max_len}"
            )
        if args.beam < 1:
            raise ValueError(f"--beam must be >= 1, got {args.beam}")
    except ValueError as e:
        raise UsageError(f"decode: {e}") from e
    src = pad_batch(rows)  # (B, S)
    max_len = max(task.longest_target, 2 * longest)
    with torch.no_grad():
        if args.beam == 1:
            pred = greedy(model, src, bos=BOS, eos=EOS, pad=PAD, max_len=max_len)
        else:
            pred = beam_search(
                model, src, bos=BOS, eos=EOS, pad=PAD, max_len=max_len, beam_size=args.beam
            )
    for text, row in zip(args.sequences, pred.tolist(), strict=True):
        print(f"{text}\t{task.decode(row)}")
    if args.alignment_dir is not None:
        paths = write_alignments(
            model, task.vocab, src, pred, args.alignment_dir, eos=EOS, bos=BOS, pad=PAD
        )
        print(f"wrote {len(paths)} alignment PNGs to {args.alignment_dir}", file=sys.stderr)
    return 0
