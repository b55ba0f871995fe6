"""`attnkit lm train|sample`: a small GPT, trained and sampled from the command line.

    attnkit lm train                                  # on Python's own standard library
    attnkit lm train --text book.txt --out runs/book
    attnkit lm train --text my_repo/ --pack --tokenizer bpe   # one file = one document
    attnkit lm sample --checkpoint attnkit-out/lm --prompt "def main(" --temperature 0.8

--text is a text file, a JSON Lines file (.jsonl, one record = one document, its text in
--text-field) or a folder (every UTF-8 file under it, sorted; one file = one document). The
default corpus is the standard library's .py files (sysconfig's "stdlib" folder, no
site-packages; one file = one document), read in sorted order up to --max-chars characters:
every machine has it and the same Python gives the same text. In a single text file the
documents are its paragraphs (split after blank lines), or the pieces between --doc-sep. The
run prints how many documents it found and their lengths. The last 10% of the text is held
out; its loss is printed each epoch. The checkpoint (checkpoint.pt: weights, config,
tokenizer, history) is written atomically at the end of each epoch.

Tokens are characters (--tokenizer char) or byte-level BPE subwords learnt from the training
text with the `tokenizers` library (--tokenizer bpe --vocab-size V), saved in the checkpoint
and used by `lm sample`. Training rows are random windows of the text, across documents,
unless --pack: then the documents are packed back to back into rows of --context + 1 tokens
with document ids; attention and the loss stay inside each document and nothing is padded
(benchmarks/bench_packing.py measures it against padding one document per row).
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
from attnkit.cli._paths import load_torch
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
    "vocab_size": 512,
}
HELD_OUT = 0.1  # fraction of the text, at its end
TRAIN_DOC = """\
Train a small GPT on characters or BPE subwords. The learning-rate schedule lasts --max-steps
steps when given, else --epochs x --steps-per-epoch; --max-time fits it to the time (from the
measured step time). The checkpoint is written at the end of every epoch, at the schedule's
end and when --max-time runs out; --resume continues it step for step (give the same options,
--epochs and --max-steps included: they set where the learning rate ends)."""
TRAIN_EPILOG = """\
examples:
  attnkit lm train
  attnkit lm train --max-steps 2000 --max-time 600 --out runs/long
  attnkit lm train --pack --tokenizer bpe --vocab-size 1024 --out runs/bpe

Ctrl-C keeps the last checkpoint and says which (path, step, epoch); exit codes: 0 done (or
stopped by --max-time), 1 failed, 2 bad usage, 130 interrupted."""
SAMPLE_DOC = "Continue --prompt with the GPT that `attnkit lm train` wrote into --checkpoint."
SAMPLE_EPILOG = """\
examples:
  attnkit lm sample --checkpoint attnkit-out/lm --prompt "def " --temperature 0.8
  attnkit lm sample --checkpoint attnkit-out/lm --prompt "import " --temperature 0 --json"""


def register(subparsers) -> None:
    _, sub = add_command_group(
        subparsers,
        "lm",
        "train a small GPT (characters or BPE), sample from it",
        __doc__,
        "lm_command",
    )
    raw = argparse.RawDescriptionHelpFormatter  # the examples keep their lines
    _add_train(
        sub.add_parser(
            "train",
            help="train a small GPT on your text",
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
    p.add_argument("--text", type=Path, metavar="PATH", help="a UTF-8 text file, a .jsonl file "
                   "or a folder of text files to train on (default: the Python standard "
                   "library's .py files)")  # fmt: skip
    p.add_argument(
        "--text-field", default="text", metavar="NAME",
        help="the field holding each record's text in a .jsonl --text (default text)",
    )  # fmt: skip
    p.add_argument(
        "--doc-sep", metavar="SEP",
        help="the separator between documents in a text file, e.g. '<|endoftext|>'; "
        "backslash-n in it means a newline (default: blank lines)",
    )  # fmt: skip
    p.add_argument(
        "--tokenizer", choices=("char", "bpe"), default="char",
        help="characters, or byte-level BPE learnt from the text (default char)",
    )  # fmt: skip
    add_out_options(p, "lm", "checkpoint.pt and history.json")
    add_report_options(p)
    for name, kind, what in (
        ("epochs", positive_int, "passes of --steps-per-epoch steps"),
        ("steps_per_epoch", positive_int, "training steps between held-out evaluations"),
        ("batch_size", positive_int, "rows per step (windows, or packed rows with --pack)"),
        ("context", positive_int, "tokens the model sees at once"),
        ("layers", positive_int, "GPT blocks"),
        ("heads", positive_int, "attention heads"),
        ("d_model", positive_int, "model width (a multiple of --heads)"),
        ("lr", positive_float, "peak AdamW learning rate (cosine decay, short warm-up)"),
        ("max_chars", positive_int, "read at most this many characters of the corpus"),
        ("vocab_size", positive_int, "BPE vocabulary: 256 bytes + merges (--tokenizer bpe)"),
    ):
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=kind, default=d[name], help=f"{what} (default {d[name]})")
    add_max_steps(p, "train S steps in all: the learning-rate schedule's length (nanoGPT's "
                  "max_iters; default --epochs x --steps-per-epoch)")  # fmt: skip
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
        help="train on the documents (files, records, paragraphs or --doc-sep pieces) packed "
        "into rows with document ids: attention and loss stay inside each document, no "
        "padding (default: windows across documents)",
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
        "--prompt",
        required=True,
        help="text to continue (with a character model: characters it was trained on)",
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=200,
                   help="tokens to add (characters with --tokenizer char)")  # fmt: skip
    p.add_argument("--temperature", type=_nonnegative_float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample among the k likeliest")
    p.add_argument("--top-p", type=_probability, default=None, help="nucleus sampling mass")
    p.add_argument("--seed", type=seed_number, default=0, help="the sampling generator's seed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_threads(p, why="one character at a time is a loop of small matrix products: a second "
                "thread gains little and waits on a busy core")  # fmt: skip
    p.set_defaults(run=run_sample)


def read_corpus(args: argparse.Namespace):
    """The `Corpus` of --text (documents as --text-field / --doc-sep say); UsageError."""
    from attnkit.train.corpus import CorpusError
    from attnkit.train.corpus import read_corpus as read

    sep = args.doc_sep
    if sep is not None:
        if not sep:
            raise UsageError("--doc-sep is empty: give the text that separates documents")
        sep = sep.replace("\\n", "\n").replace("\\t", "\t")
    try:
        return read(args.text, args.max_chars, text_field=args.text_field, separator=sep)
    except CorpusError as err:
        raise UsageError(f"--text {err}") from None


def run_train(args: argparse.Namespace) -> int:
    import json

    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    if args.resume and args.force:
        raise UsageError("--resume continues the run in --out, --force replaces it: pick one")
    if args.resume and not (args.out / FILES[0]).is_file():
        raise UsageError(f"--resume: no checkpoint at {args.out / FILES[0]}: train without it")
    if args.tokenizer == "bpe" and args.vocab_size < 257:
        raise UsageError(f"--vocab-size {args.vocab_size}: byte-level BPE needs at least 257")
    corpus = read_corpus(args)
    text = corpus.text
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
        summary = train(args, corpus, split, FORMAT, FILES, kept)
    except KeyboardInterrupt:
        print(f"attnkit lm train: interrupted; {_kept(kept)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(summary))
        return 0
    files = f"wrote {args.out / FILES[0]} and {args.out / FILES[1]}"
    loss = f"held-out loss {summary['held_out_loss']:.3f}"
    rate = f"{summary['tokens_per_second']:,.0f} tokens/s"
    if summary["stopped"]:
        print(
            f"attnkit lm train: stopped by --max-time at step {summary['steps']} of "
            f"{summary['total_steps']}, {loss}, {rate}; {files} (--resume continues)"
        )
    else:
        steps = f"{summary['steps']} steps"
        if summary["total_steps"] < summary["asked_steps"]:
            steps += f" (the schedule fitted to --max-time; {summary['asked_steps']} asked)"
        print(
            f"attnkit lm train: {loss} after {steps} in {summary['seconds']:.0f}s, {rate}; {files}"
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
    """(GPT in eval mode, tokenizer) of an `attnkit lm train` folder; UsageError."""
    from attnkit.models import GPT, GPTConfig
    from attnkit.train.text_tokenizer import from_state

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
        tokenizer = from_state(state.get("tokenizer", state.get("vocab")))
    except (KeyError, TypeError, RuntimeError, ValueError) as e:
        reason = " ".join(str(e).split())[:100]
        raise UsageError(
            f"--checkpoint: {path} does not hold a GPT attnkit can build ({reason})"
        ) from None
    return model.eval(), tokenizer


def run_sample(args: argparse.Namespace) -> int:
    import json

    import torch

    model, tokenizer = load_lm(args.checkpoint)
    if not args.prompt:
        raise UsageError("--prompt is empty: give some text to continue")
    unknown = tokenizer.unknown(args.prompt)
    if unknown:
        shown = "".join(unknown)[:20]
        raise UsageError(f"--prompt has characters the model never saw: {shown!r}")
    ids = torch.tensor([tokenizer.encode(args.prompt)])  # (1, P)
    with torch_threads(args.threads):
        out = model.generate(
            ids,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=torch.Generator().manual_seed(args.seed),
        )
    text = tokenizer.decode(out[0].tolist())
    print(json.dumps({"command": "lm sample", "text": text}) if args.json else text)
    return 0
