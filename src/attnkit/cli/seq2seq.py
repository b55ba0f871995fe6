"""`attnkit seq2seq train|decode|eval`: train a seq2seq model on a synthetic task, run it.

    attnkit seq2seq train --task reverse --out runs/reverse
    attnkit seq2seq train --model rnn --cell gru --attention additive --out runs/rnn
    attnkit seq2seq train --model universal --act --out runs/ut-act
    attnkit seq2seq decode runs/reverse "abcdef" "hgfe"
    attnkit seq2seq eval runs/rnn --by-length
    torchrun --nproc_per_node 2 -m attnkit seq2seq train --task reverse --out runs/r2

Models: the Transformer (`--preset`, `--pre-norm/--post-norm`, `--positions`), an RNN
encoder-decoder (`--cell gru|lstm`, `--attention none|additive|dot|general`) and the
Universal Transformer (`--ut-steps T`, `--act` for adaptive computation time). `--steps`
is the training budget (optimizer steps) for all of them. The checkpoint records the model
kind, so `decode` and `eval` need only the folder.

Under torchrun the run is data-parallel (gloo on CPU, nccl on GPU; --batch-size is the
global batch); rank 0 evaluates, writes the files and prints. Progress goes to stderr;
the last stdout line says what was reached and where it was written (`--json`: one JSON
summary instead). `--max-time SECONDS` stops a run after the step during which that much
time has passed and saves the checkpoint there; `--resume` continues it. Exit codes: 0 done
(or stopped by --max-time), 1 diverged, 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnkit.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    add_command_group,
    add_max_time,
    add_out_options,
    add_report_options,
    positive_float,
    positive_int,
    prepare_out,
    seed_number,
)
from attnkit.cli._errors import UsageError
from attnkit.cli._threads import add_threads

__all__ = ["add_seq2seq_parser", "register", "run_decode", "run_eval", "run_train"]

TRAIN_EPILOG = """\
examples:
  attnkit seq2seq train --task reverse --out runs/reverse
  attnkit seq2seq train --model rnn --attention additive --out runs/rnn --json
  attnkit seq2seq train --steps 5000 --max-time 600 --out runs/long
  attnkit seq2seq train --steps 5000 --resume --out runs/long

exit codes: 0 done (or stopped by --max-time), 1 diverged, 2 bad usage, 130 interrupted
(the last checkpoint is kept)."""
DECODE_EPILOG = """\
examples:
  attnkit seq2seq decode runs/reverse abcdef hgfe
  attnkit seq2seq decode runs/reverse abcdef --beam 4 --json"""
EVAL_EPILOG = """\
examples:
  attnkit seq2seq eval runs/reverse
  attnkit seq2seq eval runs/rnn --by-length --json"""


def register(subparsers) -> None:
    """Add ``seq2seq`` with its ``train``, ``decode`` and ``eval`` subcommands."""
    _, sub = add_command_group(
        subparsers,
        "seq2seq",
        "Transformer, RNN or Universal Transformer on copy/reverse/sort/add",
        __doc__,
        "seq2seq_command",
    )
    raw = argparse.RawDescriptionHelpFormatter  # the examples keep their lines
    for name, add, help, epilog in (
        ("train", _add_train, "train on a synthetic task", TRAIN_EPILOG),
        ("decode", _add_decode, "decode sequences with a trained checkpoint", DECODE_EPILOG),
        ("eval", _add_eval, "held-out exact match of a trained checkpoint", EVAL_EPILOG),
    ):
        add(sub.add_parser(name, help=help, description=help, epilog=epilog, formatter_class=raw))


def add_seq2seq_parser(train_subparsers) -> argparse.ArgumentParser:
    """Add ``seq2seq`` under an existing ``attnkit train`` subcommand."""
    parser = train_subparsers.add_parser("seq2seq", help="seq2seq models on synthetic tasks")
    _add_train(parser)
    return parser


# attnkit.seq2seq.tasks.TASKS, attnkit.seq2seq.kinds.KINDS, attnkit.models.rnn's CELLS and
# ATTENTIONS and the defaults of attnkit.seq2seq.train.TrainConfig, spelled here so that the
# parser is built without importing torch (a test keeps them equal).
TASKS = ("copy", "reverse", "sort", "add")
KINDS = ("transformer", "rnn", "universal")
CELLS = ("gru", "lstm")
ATTENTIONS = ("none", "additive", "dot", "general")
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
MAX_UT_STEPS = 64  # recurrence steps of the Universal Transformer
FILES = ("checkpoint.pt", "config.json", "metrics.json")
# Options that belong to one model kind: (dest, flag, kind).
KIND_OPTIONS = (
    ("preset", "--preset", "transformer"),
    ("norm_first", "--pre-norm/--post-norm", "transformer or universal"),
    ("positions", "--positions", "transformer"),
    ("cell", "--cell", "rnn"),
    ("attention", "--attention", "rnn"),
    ("ut_steps", "--ut-steps", "universal"),
    ("act", "--act", "universal"),
)


def _add_train(p: argparse.ArgumentParser) -> None:
    d = argparse.Namespace(**TRAIN_DEFAULTS)
    p.add_argument("--task", choices=TASKS, default="reverse", help="what to learn")
    p.add_argument("--model", choices=KINDS, default="transformer", help="model kind")
    add_out_options(p, "seq2seq", "checkpoint.pt, config.json, metrics.json, alignment PNGs")
    add_report_options(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoint.pt until --steps are done in all",
    )
    p.add_argument("--preset", help="transformer: tiny (default), base, big")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--pre-norm", dest="norm_first", action="store_true", default=None)
    norm.add_argument("--post-norm", dest="norm_first", action="store_false")
    p.add_argument("--positions", choices=("sinusoidal", "learned"), help="transformer")
    p.add_argument("--cell", choices=CELLS, help="rnn: recurrent cell (default gru)")
    p.add_argument(
        "--attention",
        choices=ATTENTIONS,
        help="rnn: none, additive (Bahdanau, default), dot or general (Luong)",
    )
    p.add_argument(
        "--ut-steps",
        type=positive_int,
        metavar="T",
        help="universal: recurrence steps T, with --act the most a position takes (default 4)",
    )
    p.add_argument(
        "--act", action="store_true", default=None, help="universal: adaptive computation time"
    )
    p.add_argument("--label-smoothing", type=float)
    p.add_argument(
        "--steps",
        "--max-steps",
        type=positive_int,
        default=d.steps,
        help="training budget in optimizer steps (default 1500)",
    )
    add_max_time(p)
    p.add_argument("--batch-size", type=positive_int, default=d.batch_size, help="global batch")
    p.add_argument("--lr", type=positive_float, default=d.lr)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--eval-every", type=positive_int, default=d.eval_every)
    p.add_argument("--eval-size", type=positive_int, default=d.eval_size)
    p.add_argument("--stop-at", type=float, default=d.stop_at, help="stop at this exact match")
    p.add_argument("--seed", type=seed_number, default=d.seed)
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
    # Small models run fastest on one thread; on a shared, loaded CPU two intra-op threads
    # made training and decoding 8-20x slower (benchmarks/results/threads.md).
    add_threads(p)


def _add_decode(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="a `seq2seq train --out` directory")
    p.add_argument("sequences", nargs="+", help="source sequences, e.g. abcd or '12+7'")
    p.add_argument("--beam", type=positive_int, default=1, help="beam size (1: greedy)")
    p.add_argument("--alignment-dir", type=Path, help="write cross-attention PNGs here")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    _add_threads(p)
    p.set_defaults(run=run_decode)


def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="a `seq2seq train --out` directory")
    p.add_argument("--eval-size", type=positive_int, default=500, help="held-out examples")
    p.add_argument("--seed", type=seed_number, default=1234, help="seed of the held-out draw")
    p.add_argument(
        "--by-length",
        action="store_true",
        help="also exact match per source length, --eval-size examples each (copy/reverse/sort)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    _add_threads(p)
    p.set_defaults(run=run_eval)


def _model_overrides(args: argparse.Namespace) -> dict:
    """The model config fields the options ask for; UsageError for an option of another kind."""
    for dest, flag, kinds in KIND_OPTIONS:
        if getattr(args, dest) is not None and args.model not in kinds:
            raise UsageError(f"{flag} applies to --model {kinds}, not --model {args.model}")
    names = {"norm_first": "norm_first", "positions": "positions", "cell": "cell"}
    names |= {"attention": "attention", "ut_steps": "steps", "act": "act"}
    names |= {"label_smoothing": "label_smoothing"}
    return {
        field: getattr(args, dest)
        for dest, field in names.items()
        if getattr(args, dest) is not None
    }


def _describe(kind: str, cfg) -> str:
    if kind == "rnn":
        return f"rnn ({cfg.cell}, attention {cfg.attention})"
    if kind == "universal":
        return f"universal ({cfg.steps} steps{', ACT' if cfg.act else ''})"
    return "transformer"


def run_train(args: argparse.Namespace) -> int:
    import torch

    from attnkit.seq2seq.kinds import make_config
    from attnkit.seq2seq.tasks import Task
    from attnkit.seq2seq.train import train, train_config_from
    from attnkit.train.loop import TrainingDiverged, distributed

    if args.max_len > MAX_LEN:
        raise UsageError(f"--max-len {args.max_len} is too long: at most {MAX_LEN} tokens")
    if args.ut_steps is not None and args.ut_steps > MAX_UT_STEPS:
        raise UsageError(f"--ut-steps {args.ut_steps} is too many: at most {MAX_UT_STEPS}")
    if args.resume and not (args.out / "checkpoint.pt").is_file():
        raise UsageError(f"--resume: no checkpoint at {args.out / 'checkpoint.pt'}; train first")
    if args.resume and args.force:
        raise UsageError("--resume continues the run in --out, --force replaces it: pick one")
    overrides = _model_overrides(args)
    try:
        task = Task(
            args.task,
            min_len=args.min_len,
            max_len=args.max_len,
            num_symbols=args.num_symbols,
            max_digits=args.max_digits,
        )
        cfg = train_config_from(vars(args))
        model_cfg = make_config(task, args.model, args.preset or "tiny", **overrides)
    except ValueError as e:
        raise UsageError(f"train: {e}") from e
    # every input is checked: only now may the folder be created (or emptied with --force)
    prepare_out(args.out, () if args.resume else FILES, force=args.force)
    if args.force:
        for name in FILES:
            (args.out / name).unlink(missing_ok=True)
    torch.set_num_threads(args.threads)
    try:
        with distributed() as device:
            _, metrics = train(
                task,
                model_cfg,
                cfg,
                out=args.out,
                resume=args.resume,
                progress=args.progress and not (args.quiet or args.json),
                device=device,
            )
    except ValueError as e:  # a resumed run with other settings
        raise UsageError(f"train: {e}") from e
    except TrainingDiverged as e:
        print(f"attnkit seq2seq train: error: {e} (files in {args.out})", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        where = f"; the last good checkpoint is in {args.out}"
        print(f"attnkit seq2seq train: interrupted{where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not metrics:  # the other ranks of a torchrun launch report nothing
        return 0
    summary = {k: v for k, v in metrics.items() if k != "history"}
    if args.json:
        info = {"command": "seq2seq train", "model": args.model, "task": task.name}
        print(json.dumps({**info, **summary, "out": str(args.out)}))
        return 0
    match = "-" if summary["exact_match"] is None else f"{summary['exact_match']:.1%}"
    what = f"{_describe(args.model, model_cfg)} on {task.name}: exact match {match}"
    held = f"({summary['eval_size']} held-out)"
    if summary["stopped"]:
        print(
            f"attnkit seq2seq train: stopped by --max-time at step {summary['step']} of "
            f"{summary['steps']}: {what} {held}; wrote {args.out}/ (--resume continues)"
        )
        return 0
    print(
        f"attnkit seq2seq train: {what} {held} at step {summary['step']}, "
        f"{summary['seconds']:.1f} s, {summary['params']:,} params; wrote {args.out}/"
    )
    return 0


def _load(args: argparse.Namespace):
    import torch

    from attnkit.seq2seq.train import load_checkpoint

    torch.set_num_threads(args.threads)
    if args.checkpoint.is_file() and args.checkpoint.suffix != ".pt":
        raise UsageError(f"checkpoint {str(args.checkpoint)!r} is a file: give a run folder")
    try:
        return load_checkpoint(args.checkpoint)
    except ValueError as e:
        raise UsageError(str(e)) from e


def run_decode(args: argparse.Namespace) -> int:
    import torch

    from attnkit.models.decoding import beam_search, greedy
    from attnkit.seq2seq.alignment import write_alignments
    from attnkit.seq2seq.tasks import BOS, EOS, PAD, pad_batch
    from attnkit.seq2seq.train import has_attention

    model, task = _load(args)
    try:
        rows = [[*task.encode(s), EOS] for s in args.sequences]
    except ValueError as e:
        raise UsageError(f"decode: {e}") from e
    if any(len(r) < 2 for r in rows):
        raise UsageError("decode: sequences must not be empty")
    longest = max(len(r) for r in rows)
    limit = getattr(model.cfg, "max_len", None)  # the RNN has no length limit
    if limit is not None and longest > limit:
        raise UsageError(
            f"decode: sequences have up to {longest} tokens; the model takes at most {limit}"
        )
    if args.alignment_dir is not None and not has_attention(model):
        raise UsageError("--alignment-dir: this RNN has no attention, so no alignment to draw")
    src = pad_batch(rows)  # (B, S)
    max_len = max(task.longest_target, 2 * longest)
    with torch.no_grad():
        if args.beam == 1:
            pred = greedy(model, src, bos=BOS, eos=EOS, pad=PAD, max_len=max_len)
        else:
            pred = beam_search(
                model, src, bos=BOS, eos=EOS, pad=PAD, max_len=max_len, beam_size=args.beam
            )
    outputs = [task.decode(row) for row in pred.tolist()]
    if args.json:
        pairs = [{"source": s, "output": o} for s, o in zip(args.sequences, outputs, strict=True)]
        print(json.dumps({"command": "seq2seq decode", "decoded": pairs}))
    else:
        for text, out in zip(args.sequences, outputs, strict=True):
            print(f"{text}\t{out}")
    if args.alignment_dir is not None:
        paths = write_alignments(
            model, task.vocab, src, pred, args.alignment_dir, eos=EOS, bos=BOS, pad=PAD
        )
        print(f"wrote {len(paths)} alignment PNGs to {args.alignment_dir}", file=sys.stderr)
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from attnkit.seq2seq.tasks import heldout
    from attnkit.seq2seq.train import evaluate, evaluate_by_length

    model, task = _load(args)
    if args.by_length and task.name == "add":
        raise UsageError("--by-length: for copy, reverse and sort (the add task has no length)")
    src, tgt = heldout(task, args.eval_size, seed=args.seed)
    result = {"exact_match": evaluate(model, task, src, tgt)["exact_match"]}
    if args.by_length:
        result["by_length"] = evaluate_by_length(model, task, args.eval_size, seed=args.seed)
    if args.json:
        print(json.dumps({"command": "seq2seq eval", "task": task.name, **result}))
        return 0
    for length, value in result.get("by_length", {}).items():
        print(f"length {length}: {value:.1%}")
    print(
        f"attnkit seq2seq eval: exact match {result['exact_match']:.1%} on {args.eval_size} "
        f"held-out {task.name} examples ({args.checkpoint})"
    )
    return 0
