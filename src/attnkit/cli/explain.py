"""`attnkit explain`: run a pretrained model on a sentence and show where one token looks.

Dimensions: L layers, H heads, N tokens (special tokens included).

A BERT checkpoint (and the embedded all-MiniLM-L6-v2) runs on attnkit's own `BertEncoder`
(no `transformers`); other local Hugging Face checkpoints (RoBERTa, DistilBERT, GPT-2,
Llama-style decoders) run on transformers with ``attn_implementation="attnkit"``
(`attnkit.cli._explain_hf`), a ViT on an --image (`attnkit.cli._explain_vit`). The maps come
from `attnkit.record_attention`. Prints a table per layer (mean over heads) and per head of
the last layer, then writes a head view (HTML), a model view (PNG), the head distances (PNG)
and the maps (JSON) into --out, each atomically, after everything has been computed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from attnkit.cli._common import (
    add_out_options,
    add_report_options,
    int_list,
    positive_int,
    prepare_out,
)
from attnkit.cli._errors import FileError, UsageError
from attnkit.cli._explain_report import SPECIAL, ranked, report, strongest
from attnkit.cli._threads import add_threads, torch_threads

__all__ = ["DEFAULT_TEXT", "find_focus", "ranked", "register", "report", "run"]

DEFAULT_TEXT = "The animal didn't cross the street because it was too tired"
CHECKPOINT_HINT = (
    "pass --checkpoint DIR with a Hugging Face BERT folder (config.json, model.safetensors)"
)


EPILOG = """\
examples:
  attnkit explain
  attnkit explain "The cat sat on the mat." --focus cat --layers 4-5 --out runs/cat
  attnkit explain "Who is she?" --pair "She is my sister." --json --out runs/pair"""


def register(subparsers) -> None:
    """Add the ``explain`` subcommand to `subparsers` (``set_defaults(run=run)``)."""
    p = subparsers.add_parser(
        "explain",
        help="show where a token of a sentence attends, in a pretrained BERT",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "text",
        nargs="?",
        default=DEFAULT_TEXT,
        metavar="TEXT",
        help=f'sentence to run (default: "{DEFAULT_TEXT}")',
    )
    p.add_argument("--pair", metavar="TEXT_B", help="second segment (token type 1)")
    p.add_argument(
        "--focus",
        metavar="TOKEN",
        help="word whose attention is shown (default: the text's first pronoun, such as "
        "'it', 'she' or 'they', else its last word; stderr says which)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        type=Path,
        help="a local Hugging Face checkpoint folder: BERT (read by attnkit itself), "
        "RoBERTa, DistilBERT, GPT-2, Llama-style or ViT (read by transformers, the [hf] "
        "extra) (default: embedded all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--layers",
        nargs="+",
        type=int_list,
        metavar="L",
        help="layers to show and write, e.g. 3, 3-5 or 0,2,4 (default: all; -1 is the last)",
    )
    p.add_argument(
        "--heads", nargs="+", type=int_list, metavar="H", help="heads, e.g. 0,11 (default: all)"
    )
    p.add_argument(
        "--image",
        metavar="FILE",
        type=Path,
        help="picture to explain when --checkpoint is an image model (ViT)",
    )
    add_out_options(p, "explain", "head_view.html, model_view.png, attention.json")
    add_report_options(p)
    p.add_argument(
        "--top", type=positive_int, default=3, metavar="K", help="tokens per row (default 3)"
    )
    add_threads(p)
    p.set_defaults(run=run)


@contextlib.contextmanager
def _step(message: str, after: float = 1.0) -> Iterator[None]:
    """Say `message` on stderr only if the step runs longer than `after` seconds, so a
    fast step (or one that fails fast) prints nothing."""
    start, shown = time.perf_counter(), []

    def say() -> None:
        shown.append(True)
        print(f"attnkit explain: {message} ...", file=sys.stderr, flush=True)

    timer = threading.Timer(after, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
    if shown:
        took = time.perf_counter() - start
        print(f"attnkit explain: {message}: done in {took:.1f} s", file=sys.stderr, flush=True)


# The files `explain` writes (attnkit.cli._render.FILES, spelled here to avoid importing torch).
FILES = ("head_view.html", "model_view.png", "attention.json", "head_distance.png")


def _check_args(args: argparse.Namespace) -> None:
    if not args.text.strip():
        raise UsageError('TEXT is empty: give a sentence, e.g. attnkit explain "The cat sat."')
    if args.pair is not None and not args.pair.strip():
        raise UsageError("--pair is empty: give a second sentence or leave --pair out")
    if args.checkpoint is not None and args.checkpoint.is_file():
        raise UsageError(
            f"--checkpoint {str(args.checkpoint)!r} is a file: give the folder that holds "
            "config.json and the weights"
        )


def _open(folder: Path | None):
    """(folder, display name, BertConfig, Tokenizer): the fast checks, before any weights
    are read. UsageError for a missing or unsupported checkpoint, FileError for a damaged
    file in it."""
    from attnkit.models import BertConfig, Tokenizer, default_checkpoint
    from attnkit.models.checkpoint import CheckpointError, checkpoint_files

    try:
        name = "all-MiniLM-L6-v2 (embedded)" if folder is None else str(folder)
        folder = default_checkpoint() if folder is None else folder
        config = BertConfig.from_json(checkpoint_files(folder)[0])
        tokenizer = Tokenizer.from_pretrained(folder)  # the checkpoint's own length limit
    except CheckpointError as e:
        raise FileError(f"--checkpoint: {e}") from None
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"{e}; {CHECKPOINT_HINT}") from None
    return folder, name, config, tokenizer


def _load_model(folder: Path, name: str):
    """attnkit's BERT with the folder's weights: every tensor it wants, no tensor of another
    model (a task head or the pooler aside; see `attnkit.models.checkpoint.check_keys`),
    else a FileError naming the weights file: never an explanation of random weights."""
    from attnkit.models import BertEncoder
    from attnkit.models.checkpoint import CheckpointError

    with _step(f"loading {name}"):
        try:
            return BertEncoder.from_pretrained(folder)
        except CheckpointError as e:
            raise FileError(f"--checkpoint: {e}") from None
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(f"{e}; {CHECKPOINT_HINT}") from None


def words_of(tokens: Sequence[str]) -> list[tuple[str, int]]:
    """(first piece, its index) of each word of WordPiece tokens: special tokens and "##"
    continuation pieces left out."""
    return [(t, i) for i, t in enumerate(tokens) if t not in SPECIAL and not t.startswith("##")]


def find_focus(tokens: Sequence[str], focus: str, pieces_of: Callable[[str], list[str]]) -> int:
    """Index of the first token equal to `focus` (case-insensitive), else of the first
    piece of `focus` split by the tokenizer (`pieces_of`); UsageError listing the tokens."""
    wanted = focus.strip().lower()
    lowered = [t.lower() for t in tokens]
    if wanted in lowered:
        return lowered.index(wanted)
    pieces = [p.lower() for p in pieces_of(focus)] if wanted else []
    words = " ".join(t for t in tokens if t not in SPECIAL)
    if wanted != "[unk]" and "[unk]" in pieces:
        raise UsageError(
            f"--focus {focus!r} has characters the model's vocabulary lacks (it reads as [UNK], "
            f"whose weights say nothing about the word); pick one of the text's tokens: {words}"
            " (or pass --checkpoint with a model that reads the language, e.g. a Chinese BERT)"
        )
    for i in range(len(lowered) - len(pieces) + 1):
        if pieces and lowered[i : i + len(pieces)] == pieces:
            return i
    words = " ".join(t for t in tokens if t not in SPECIAL)
    raise UsageError(f"--focus {focus!r} is not in the text; its tokens are: {words}")


def _indices(
    option: str, picked: Sequence[Sequence[range]] | None, size: int, what: str
) -> list[int]:
    """The indices of --layers / --heads (ranges from `int_list`, one list per word), each
    range checked by its ends before it is expanded: '0-99999999999' is refused, not built."""
    if picked is None:
        return list(range(size))
    ranges = [r for group in picked for r in group]
    for r in ranges:
        for i in (r[0], r[-1]):
            if not -size <= i < size:
                raise UsageError(
                    f"{option} {i} is out of range: the model has {size} {what} (0..{size - 1})"
                )
    return [i % size for r in ranges for i in r]


def _prepare_bert(args: argparse.Namespace):
    """`Prepared` for attnkit's own BERT encoder (the embedded model or a BERT folder)."""
    from attnkit.cli._explain_hf import Prepared, pick_focus

    folder, name, config, tokenizer = _open(args.checkpoint)
    from attnkit.models import TextTooLong

    what = "TEXT with --pair" if args.pair else "TEXT"
    try:
        encoding = tokenizer.encode(args.text, args.pair)
    except TextTooLong as e:
        raise UsageError(
            f"{what} has {e.count} tokens ([CLS]/[SEP] included) but {name} takes at most "
            f"{e.limit} (its {e.source}): shorten it"
        ) from None
    except ValueError as e:
        raise UsageError(str(e).replace("text 0", what)) from None
    tokens = encoding.tokens[0]
    texts = [args.text] + ([args.pair] if args.pair else [])
    unknown = unknown_pieces(texts, tokenizer.tokenize)
    if args.focus is None:
        focus, why = pick_focus(words_of(tokens), unknown)
    else:
        focus, why = find_focus(tokens, args.focus, tokenizer.tokenize), ""

    def compute():
        import torch

        from attnkit.viz.record import record_attention

        model = _load_model(folder, name)
        with torch.inference_mode(), record_attention(model) as rec:
            model(**encoding.model_inputs())
        return rec.stack()[:, 0]  # (L, 1, H, N, N) -> (L, H, N, N)

    return Prepared(
        name=name,
        tokens=tokens,
        special=[t in SPECIAL for t in tokens],
        focus=focus,
        focus_reason=why,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        compute=compute,
        unknown=unknown,
    )


def unknown_pieces(texts: Sequence[str], pieces_of: Callable[[str], list[str]]) -> list[str]:
    """What of `texts` the WordPiece vocabulary reads as [UNK]: the characters that are
    unknown on their own, else the whole (whitespace-separated) word."""
    found: list[str] = []
    for word in (w for text in texts for w in text.split()):
        if "[UNK]" not in pieces_of(word):
            continue
        chars = [c for c in dict.fromkeys(word) if "[UNK]" in pieces_of(c)]
        found += [c for c in (chars or [word]) if c not in found]
    return found


def run(args: argparse.Namespace) -> int:
    """Run the command; UsageError for bad input (the caller prints it and exits 2)."""
    _check_args(args)
    from attnkit.cli import _explain_hf

    kind = _explain_hf.checkpoint_kind(args.checkpoint)
    if args.image is not None and kind != "vision":
        raise UsageError(
            "--image is for image checkpoints (ViT): leave it out to explain TEXT, or pass "
            "--checkpoint with a ViT folder"
        )
    if kind == "vision":
        from attnkit.cli import _explain_vit

        with torch_threads(args.threads):
            return _explain_vit.run(args, FILES)
    prep = _explain_hf.prepare(args, _step) if kind == "hf" else _prepare_bert(args)
    layers = _indices("--layers", args.layers, prep.num_layers, "layers")
    heads = _indices("--heads", args.heads, prep.num_heads, "heads")
    prepare_out(args.out, FILES, force=args.force)
    # every input is checked before the slow part
    import torch

    from attnkit.analysis.heads import head_stats
    from attnkit.cli import _render

    with torch_threads(args.threads):
        maps = prep.compute()[layers][:, heads]  # (L, H, N, N) -> (L', H', N, N)
    tokens, focus = prep.tokens, prep.focus
    layer_names = [f"layer {i}" for i in layers]

    show = not (args.quiet or args.json)  # --json: stdout is the JSON summary, nothing else
    say = print if show else (lambda *a, **k: None)
    kind_note = " (decoder: each token attends to itself and earlier tokens)" * prep.decoder
    say(f"{prep.name}: {prep.num_layers} layers x {prep.num_heads} heads{kind_note}")
    if prep.focus_reason and not args.quiet:  # stdout stays the report: the choice on stderr
        print(f"attnkit explain: showing {tokens[focus]!r}, {prep.focus_reason}; choose another "
              "word with --focus", file=sys.stderr)  # fmt: skip
    if prep.unknown:
        say(_unknown_note(prep.unknown, embedded=args.checkpoint is None))
    _font_check([args.text, args.pair or "", *tokens])
    say("\n".join(report(maps, tokens, focus, layers, heads, args.top, special=prep.special)))

    special = torch.tensor(prep.special)  # (N,)
    stats = head_stats(maps[:, None], special=special)  # (L', B=1, H', N, N)
    say("\nwhat the heads do (distance in tokens, entropy, weight on special tokens):")
    say("\n".join("  " + line for line in stats.summary(layer_names=layer_names)))

    view = strongest(maps, tokens, focus, prep.special)
    meta = {
        "view": None if view is None else {"layer": layers[view[0]], "head": heads[view[1]]},
        "text": args.text,
        "pair": args.pair,
        "focus": {"token": tokens[focus], "index": focus},
        "checkpoint": prep.name,
        "layers": layers,
        "heads": heads,
        "decoder": prep.decoder,
        "unknown": prep.unknown,
    }
    with _step("rendering"):
        written = _render.write_all(args.out, tokens, maps, layer_names, meta, stats)
    if args.json:
        files = [str(p) for p in written]
        print(json.dumps({"command": "explain", **meta, "files": files, "out": str(args.out)}))
    else:
        say()
        print(f"attnkit explain: wrote {', '.join(p.name for p in written)} to {args.out}/")
    return 0


def _unknown_note(unknown: Sequence[str], embedded: bool = False) -> str:
    from attnkit.viz.fonts import has_cjk

    shown = ", ".join(repr(u) for u in unknown)
    note = (
        f"note: the tokenizer cannot represent {shown}: read as its unknown token, which "
        "carries no meaning (left out of the top words below)"
    )
    if embedded and any(has_cjk(u) for u in unknown):
        note += (
            "\nnote: all-MiniLM-L6-v2 was trained on English: its vocabulary has 244 Chinese "
            "characters (of some 3,500 in common use), so most Chinese, Japanese and Korean "
            "text reads as [UNK]; for such text pass --checkpoint with a BERT that reads it "
            "(e.g. a local copy of bert-base-chinese)"
        )
    return note


def _font_check(texts: Sequence[str]) -> None:
    """One line on stderr when the pictures need a CJK font that is not installed."""
    from attnkit.viz.fonts import INSTALL_HINT, cjk_font_file, has_cjk

    if any(has_cjk(t) for t in texts) and cjk_font_file() is None:
        print(f"attnkit explain: warning: {INSTALL_HINT}", file=sys.stderr)
