"""`attnkit lm train|sample`: a character-level GPT, trained and sampled from the command line.

    attnkit lm train                                  # on Python's own standard library
    attnkit lm train --text book.txt --out runs/book
    attnkit lm train --pack                           # paragraphs packed, attended apart
    attnkit lm sample --checkpoint attnkit-out/lm --prompt "def main(" --temperature 0.8

The default corpus is the standard library's .py files (sysconfig's "stdlib" folder, no
site-packages), read in sorted order up to --max-chars characters: every machine has it and
the same Python gives the same text. The last 10% of the text is held out; its loss is
printed each epoch. The checkpoint (checkpoint.pt: weights, config, vocabulary, history) is
written atomically at the end of each epoch.

Training rows are random windows of the text, across paragraphs, unless --pack: then the text
is cut into paragraphs (at blank lines) that are packed back to back into rows of --context + 1
characters with document ids; attention and the loss stay inside each paragraph and nothing
is padded (benchmarks/bench_packing.py measures it against padding one paragraph per row).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.cli._common import (
    EXIT_INTERRUPTED,
    add_command_group,
    add_max_steps,
    add_max_time,
    add_out_options,
    add_report_options,
    positive_float,
    positive_int,
    prepare_out,
    remove_results,
    seed_number,
)
from attnkit.cli._errors import UsageError
from attnkit.cli._paths import input_file, load_torch
from attnkit.cli._threads import add_threads, torch_threads

__all__ = ["load_lm", "read_corpus", "register"]

FORMAT = "attnkit-lm-v1"  # the checkpoint's marker
FILES = ("checkpoint.pt", "history.json")
TRAIN_DEFAULTS = {
    "epochs": 4,
    "steps_per_epoch": 100,
    "batch_size": 32,
    "context": 128,
    "layers": 2,
    "heads": 4,
    "d_model": 128,
    "lr": 3e-3,
    "max_chars": 1_000_000,
    "seed": 0,
}
HELD_OUT = 0.1  # fraction of the text, at its end
TRAIN_DOC = """\
Train a character-level GPT. The checkpoint is written at the end of every epoch, at
--max-steps and when --max-time runs out; --resume continues it step for step (give the same
options, --epochs and --max-steps included: they set where the learning rate ends)."""
TRAIN_EPILOG = """\
examples:
  attnkit lm train
  attnkit lm train --epochs 40 --max-time 600 --out runs/long
  attnkit lm train --epochs 40 --resume --out runs/long

Ctrl-C keeps the last checkpoint and says which (path, step, epoch); exit codes: 0 done (or
stopped by --max-time), 1 failed, 2 bad usage, 130 interrupted."""
SAMPLE_DOC = "Continue --prompt with the GPT that `attnkit lm train` wrote into --checkpoint."
SAMPLE_EPILOG = """\
examples:
  attnkit lm sample --checkpoint attnkit-out/lm --prompt "def " --temperature 0.8
  attnkit lm sample --checkpoint attnkit-out/lm --prompt "import " --temperature 0 --json"""


def register(subparsers) -> None:
    _, sub = add_command_group(
        subparsers, "lm", "train a character-level GPT, sample from it", __doc__, "lm_command"
    )
    raw = argparse.RawDescriptionHelpFormatter  # the examples keep their lines
    _add_train(
        sub.add_parser(
            "train",
            help="train a character-level GPT",
            epilog=TRAIN_EPILOG,
            description=TRAIN_DOC,
            formatter_class=raw,
        )
    )
    _add_sample(sub.add_parser("sample", help="continue a prompt with a trained GPT",
                               epilog=SAMPLE_EPILOG, formatter_class=raw,
                               description=SAMPLE_DOC))  # fmt: skip


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _probability(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _add_train(p: argparse.ArgumentParser) -> None:
    d = TRAIN_DEFAULTS
    p.add_argument("--text", type=Path, metavar="FILE", help="UTF-8 text to train on "
                   "(default: the Python standard library's .py files)")  # fmt: skip
    add_out_options(p, "lm", "checkpoint.pt and history.json")
    add_report_options(p)
    for name, kind, what in (
        ("epochs", positive_int, "passes of --steps-per-epoch steps"),
        ("steps_per_epoch", positive_int, "training steps between held-out evaluations"),
        ("batch_size", positive_int, "rows per step (windows, or packed rows with --pack)"),
        ("context", positive_int, "characters the model sees at once"),
        ("layers", positive_int, "GPT blocks"),
        ("heads", positive_int, "attention heads"),
        ("d_model", positive_int, "model width (a multiple of --heads)"),
        ("lr", positive_float, "peak AdamW learning rate (cosine decay, short warm-up)"),
        ("max_chars", positive_int, "read at most this many characters of the corpus"),
    ):
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=kind, default=d[name], help=f"{what} (default {d[name]})")
    add_max_steps(p)
    add_max_time(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoint (weights, optimizer, step, random "
        "state) until --epochs are done; the other options must be the run's own",
    )
    p.add_argument(
        "--seed", type=seed_number, default=d["seed"], help="model init and window order"
    )
    p.add_argument(
        "--pack",
        action="store_true",
        help="train on the paragraphs (split at blank lines) packed into rows with document "
        "ids: attention and loss stay inside each paragraph, no padding (default: windows "
        "across paragraphs)",
    )
    p.add_argument(
        "--rotary",
        action="store_true",
        help="rotary positions (RoPE) on queries and keys instead of a learned position table",
    )
    add_threads(p)
    p.set_defaults(run=run_train)


def _add_sample(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, required=True, metavar="DIR",
                   help="the --out folder of `attnkit lm train`")  # fmt: skip
    p.add_argument(
        "--prompt", required=True, help="text to continue (characters it was trained on)"
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=200, help="characters to add")
    p.add_argument("--temperature", type=_nonnegative_float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample among the k likeliest")
    p.add_argument("--top-p", type=_probability, default=None, help="nucleus sampling mass")
    p.add_argument("--seed", type=seed_number, default=0, help="the sampling generator's seed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_threads(p, why="one character at a time is a loop of small matrix products: a second "
                "thread gains little and waits on a busy core")  # fmt: skip
    p.set_defaults(run=run_sample)


def read_corpus(text: Path | None, max_chars: int) -> tuple[str, str]:
    """The training text and a one-line description of where it came from."""
    if text is not None:
        input_file(text, "--text", "a UTF-8 text file")
        try:
            body = text.read_text(encoding="utf-8")[:max_chars]
        except UnicodeDecodeError as e:
            raise UsageError(f"--text {str(text)!r} is not UTF-8 text ({e.reason})") from None
        source = str(text)
    else:
        import sysconfig

        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(
            p for p in root.rglob("*.py")
            if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
        )  # fmt: skip
        parts, size = [], 0
        for path in files:
            if size >= max_chars:
                break
            try:
                parts.append(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue  # a few test files are deliberately not UTF-8
            size += len(parts[-1])
        body = "".join(parts)[:max_chars]
        source = f"the Python standard library ({root}, {len(parts)} files)"
    if len(body.strip()) == 0:
        raise UsageError(f"--text {source!r} is empty: give a file with some text")
    return body, source


def run_train(args: argparse.Namespace) -> int:
    import json

    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    if args.resume and args.force:
        raise UsageError("--resume continues the run in --out, --force replaces it: pick one")
    if args.resume and not (args.out / FILES[0]).is_file():
        raise UsageError(f"--resume: no checkpoint at {args.out / FILES[0]}: train without it")
    text, source = read_corpus(args.text, args.max_chars)
    split = int(len(text) * (1 - HELD_OUT))
    if min(split, len(text) - split) < args.context + 1:
        raise UsageError(
            f"--text has {len(text)} characters: too few for --context {args.context} "
            f"(need {10 * (args.context + 1)}: 90% to train, 10% held out)"
        )
    prepare_out(args.out, () if args.resume else FILES, force=args.force)
    if args.force:
        remove_results(args.out, FILES)  # an interrupted run must not leave the old ones
    from attnkit.cli._lm_train import train

    kept: dict = {}
    try:
        summary = train(args, text, source, split, FORMAT, FILES, kept)
    except KeyboardInterrupt:
        print(f"attnkit lm train: interrupted; {_kept(kept)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(summary))
        return 0
    files = f"wrote {args.out / FILES[0]} and {args.out / FILES[1]}"
    loss = f"held-out loss {summary['held_out_loss']:.3f}"
    if summary["stopped"]:
        print(
            f"attnkit lm train: stopped by --max-time at step {summary['steps']} of "
            f"{summary['total_steps']}, {loss}; {files} (--resume continues)"
        )
    else:
        print(
            f"attnkit lm train: {loss} after {summary['epochs']} epochs in "
            f"{summary['seconds']:.0f}s; {files}"
        )
    return 0


def _kept(kept: dict) -> str:
    """Which checkpoint an interrupted run leaves: path, step and how far into its epoch."""
    if not kept:
        return "no checkpoint was written yet (the first is at the end of epoch 1)"
    where = f"step {kept['step']}, epoch {kept['epoch']}"
    if kept["epoch_steps"] < kept["per"]:  # --max-steps or --max-time ended it inside an epoch
        where += f" after {kept['epoch_steps']} of its {kept['per']} steps"
    return f"kept {kept['path']} ({where}); --resume continues from it"


def load_lm(directory: Path):
    """(GPT in eval mode, vocabulary string) of an `attnkit lm train` folder; UsageError."""
    from attnkit.models import GPT, GPTConfig

    if directory.is_file():
        raise UsageError(f"--checkpoint {str(directory)!r} is a file: give the --out folder")
    path = directory / FILES[0]
    if not path.is_file():
        raise UsageError(f"--checkpoint: no {FILES[0]} in {directory}; run `attnkit lm train`")
    state = load_torch(path, "--checkpoint")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(f"--checkpoint: {path} is not an `attnkit lm` checkpoint (no {FORMAT!r})")
    try:
        model = GPT(GPTConfig(**state["config"]))
        model.load_state_dict(state["model"])
        vocab = str(state["vocab"])
    except (KeyError, TypeError, RuntimeError, ValueError) as e:
        reason = " ".join(str(e).split())[:100]
        raise UsageError(
            f"--checkpoint: {path} does not hold a GPT attnkit can build ({reason})"
        ) from None
    return model.eval(), vocab


def run_sample(args: argparse.Namespace) -> int:
    import json

    import torch

    model, vocab = load_lm(args.checkpoint)
    index = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted({ch for ch in args.prompt if ch not in index})
    if not args.prompt:
        raise UsageError("--prompt is empty: give some text to continue")
    if unknown:
        shown = "".join(unknown)[:20]
        raise UsageError(f"--prompt has characters the model never saw: {shown!r}")
    ids = torch.tensor([[index[ch] for ch in args.prompt]])  # (1, P)
    with torch_threads(args.threads):
        out = model.generate(
            ids,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=torch.Generator().manual_seed(args.seed),
        )
    text = "".join(vocab[i] for i in out[0].tolist())
    print(json.dumps({"command": "lm sample", "text": text}) if args.json else text)
    return 0
