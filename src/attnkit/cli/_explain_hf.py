"""`attnkit explain --checkpoint DIR` for checkpoints attnkit's own BERT does not load.

Dimensions: L layers, H heads, N tokens.

RoBERTa, DistilBERT, GPT-2, Llama-style decoders (and other transformers text models) run on
transformers with ``attn_implementation="attnkit"`` (`attnkit.integrations.transformers`);
their maps come from `attnkit.record_attention` like the BERT's. A decoder's maps are
causal: each token attends to itself and the tokens before it. A ViT checkpoint is handed
to the image explanation (`attnkit.cli._explain_vit`). transformers is the ``[hf]`` extra:
without it, one line says what to install.

Weights that do not fit the config.json (another model's, a part missing) are refused with
one line naming the folder, exit 1 (`FileError`), never explained as the random weights
transformers would put in their place; a model type explain cannot read (unknown to
transformers, or an encoder-decoder) is named, exit 2.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnkit._optional import install_hint
from attnkit.cli._errors import FileError, UsageError

__all__ = [
    "Prepared",
    "checked_model",
    "checkpoint_kind",
    "find_word",
    "prepare",
    "require_transformers",
]

# model_type values of image checkpoints (explained on an --image, not a text).
VISION_TYPES = frozenset({"vit", "deit", "dinov2", "beit"})


def checkpoint_kind(folder: Path | None) -> str:
    """ "bert" (attnkit's own encoder), "vision" or "hf" (transformers), from config.json alone
    (no torch, no transformers). A folder without a readable config.json is "bert": its
    loader gives the precise error."""
    from attnkit.models.checkpoint import SUPPORTED_MODEL_TYPES

    if folder is None or not (folder / "config.json").is_file():
        return "bert"
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        return "bert"
    if model_type in SUPPORTED_MODEL_TYPES:
        return "bert"
    return "vision" if model_type in VISION_TYPES else "hf"


def model_type(folder: Path) -> str:
    return str(json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_type"])


EXPLAINED = (
    "explain reads BERT (attnkit's own encoder), text encoders and decoders through "
    "transformers (RoBERTa, DistilBERT, GPT-2, Llama-style) and ViT image models"
)


def _config(hf: Any, folder: Path):
    """The transformers config of `folder`; UsageError naming a model type explain cannot
    read: one transformers does not know, or an encoder-decoder (two attention kinds)."""
    import transformers

    kind = model_type(folder)
    if kind not in transformers.CONFIG_MAPPING:
        raise UsageError(
            f"--checkpoint {str(folder)!r}: cannot load a {kind!r} model: transformers knows "
            f"no such model type; {EXPLAINED}"
        )
    try:
        config = hf._config(folder)
    except ValueError as e:
        raise UsageError(f"--checkpoint: {e}" if "checkpoint" not in str(e) else str(e)) from None
    if getattr(config, "is_encoder_decoder", False):
        raise UsageError(
            f"--checkpoint {str(folder)!r} is a {kind!r} checkpoint, an encoder-decoder: "
            f"{EXPLAINED}"
        )
    return config


def checked_model(load: Callable[[], Any]) -> Any:
    """`load()` of a transformers model, its errors as the command line says them: weights
    that do not fit the config.json are a FileError (exit 1, the folder named), anything else
    transformers cannot load a UsageError (exit 2)."""
    from attnkit.models.checkpoint import CheckpointError

    try:
        return load()
    except CheckpointError as e:
        raise FileError(f"--checkpoint: {e}") from None
    except ValueError as e:
        raise UsageError(str(e)) from None


def require_transformers(folder: Path) -> Any:
    """attnkit.integrations.transformers, or a UsageError naming the extra to install."""
    try:
        import transformers
    except ImportError:
        raise UsageError(
            f"--checkpoint {str(folder)!r} is a {model_type(folder)!r} checkpoint, which "
            f"attnkit reads through Hugging Face transformers: {install_hint('hf')}"
        ) from None
    import attnkit.integrations.transformers as hf

    transformers.utils.logging.disable_progress_bar()  # the CLI's stderr is for its own lines
    return hf


# What explain shows without --focus: the first of these in the text (the classic question is
# what a pronoun refers to), else the text's last word. Chinese pronouns are single characters
# (and WordPiece splits Chinese into characters), so "它们" is found as "它".
PRONOUNS = frozenset(
    {"it", "he", "she", "they", "him", "her", "them", "its", "his", "hers", "their", "theirs"}
    | {"we", "us", "它", "他", "她", "它们", "他们", "她们"}
)
_UNKNOWN_TOKENS = frozenset({"[UNK]", "<unk>", "<UNK>"})


@dataclass
class Prepared:
    """Everything checked before the slow part, and how to run it.

    tokens:  N token strings as shown (sub-word marks of BPE / SentencePiece decoded).
    special: N flags, True for special tokens ([CLS], <s>, <|endoftext|>, ...).
    unknown: pieces of the text the tokenizer maps to its unknown token.
    focus_reason: why `focus` was chosen when no --focus was given ("" otherwise).
    compute: runs the model and returns the maps (L, H, N, N) of every layer.
    """

    name: str
    tokens: list[str]
    special: list[bool]
    focus: int
    num_layers: int
    num_heads: int
    compute: Callable[[], Any]
    unknown: list[str] = field(default_factory=list)
    decoder: bool = False
    focus_reason: str = ""  # why explain chose `focus` when no --focus was given


def pick_focus(words: Sequence[tuple[str, int]], unknown: Sequence[str] = ()) -> tuple[int, str]:
    """The token explain shows when no --focus is given, and why: the first token of the text's
    first pronoun (`PRONOUNS`), else of its last word with a letter or digit. `words` are
    (word, index of its first token) in text order. A word the tokenizer reads as its unknown
    token (`unknown`: the pieces it cannot represent) is never chosen: its weights say
    nothing about the word."""

    def readable(word: str) -> bool:
        return word not in _UNKNOWN_TOKENS and not any(u and u in word for u in unknown)

    bare = [(w.strip(string.punctuation).lower(), i) for w, i in words if readable(w)]
    for word, i in bare:
        if word in PRONOUNS:
            return i, "the text's first pronoun"
    lost = [u for u in unknown if u.lower() in PRONOUNS]
    why = (
        f"the text's last word the model can read (its pronoun {lost[0]!r} reads as the "
        "unknown token, which carries no meaning)"
        if lost
        else "the text's last word the model can read"
        if len(bare) < len(words)
        else "the text's last word (it has no pronoun)"
    )
    for word, i in reversed(bare):
        if any(c.isalnum() for c in word):
            return i, why
    raise UsageError(
        "TEXT has no word to show the attention of"
        + (" that the model can read (every word reads as its unknown token)" if unknown else "")
        + ": give a sentence"
    )


def find_word(
    focus: str,
    words: Sequence[tuple[str, int]],
    tokens: Sequence[str],
    unknown: Sequence[str] = (),
) -> int:
    """Index of the first token of the first word equal to `focus` (case-insensitive,
    surrounding punctuation ignored), else of the first token equal to it with its sub-word
    mark removed (e.g. "." or "<s>"). UsageError listing the words otherwise."""
    wanted = focus.strip().lower()
    listed = " ".join(w for w, _ in words)
    if not wanted:
        raise UsageError(f"--focus is empty; pick one of the text's words: {listed}")
    if any(u and u.lower() in wanted for u in unknown):  # never focus an unknown token
        raise UsageError(
            f"--focus {focus!r} has characters the tokenizer cannot represent (they read as "
            f"its unknown token); pick one of the text's words: {listed}"
        )
    for text, first in words:
        if text.lower() == wanted or text.strip(string.punctuation).lower() == wanted:
            return first
    from attnkit.integrations.transformers import piece_text

    for i, tok in enumerate(tokens):
        if tok.lower() == wanted or piece_text(tok).lower() == wanted:
            return i
    raise UsageError(f"--focus {focus!r} is not in the text; its words are: {listed}")


def prepare(args, step: Callable[[str], Any]) -> Prepared:
    """Tokenize and resolve --focus / --layers / --heads for a transformers checkpoint;
    the model itself is loaded only by `Prepared.compute` (inside ``step(message)``, a
    context manager that tells a waiting user what runs)."""
    folder: Path = args.checkpoint
    hf = require_transformers(folder)
    config = _config(hf, folder)
    from attnkit.models.checkpoint import CheckpointError

    try:
        tokenizer = hf.load_tokenizer(folder)
        enc = hf.encode_text(tokenizer, args.text, args.pair)
    except CheckpointError as e:  # a damaged tokenizer file, named
        raise FileError(f"--checkpoint: {e}") from None
    except ValueError as e:
        raise UsageError(f"--checkpoint: {e}" if "checkpoint" not in str(e) else str(e)) from None
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and len(enc.tokens) > limit:
        what = "TEXT with --pair" if args.pair else "TEXT"
        raise UsageError(
            f"{what} has {len(enc.tokens)} tokens but the model takes at most {limit} "
            "(max_position_embeddings): shorten it"
        )
    from attnkit.viz.labels import token_labels

    tokens = token_labels(enc.tokens, enc.special)  # "Ġcat" -> "cat", as pictures show it
    if args.focus is None:
        focus, why = pick_focus(enc.words, enc.unknown)
    else:
        focus, why = find_word(args.focus, enc.words, tokens, enc.unknown), ""
    num_layers, num_heads = int(config.num_hidden_layers), int(config.num_attention_heads)

    def compute():
        import torch

        with step(f"loading {folder}"):
            model = checked_model(lambda: hf.load_model(folder))
        got = hf.run_text(model, enc)
        if len(got.maps) != num_layers:
            raise UsageError(
                f"--checkpoint {str(folder)!r}: the model ran {len(got.maps)} attention layers "
                f"but config.json says {num_layers}; explain reads text models with one "
                "self-attention per layer"
            )
        return torch.stack(got.maps)  # L x (H, N, N) -> (L, H, N, N)

    return Prepared(
        name=f"{folder} ({config.model_type})",
        tokens=tokens,
        special=enc.special,
        focus=focus,
        focus_reason=why,
        num_layers=num_layers,
        num_heads=num_heads,
        compute=compute,
        unknown=enc.unknown,
        decoder=hf.is_decoder(config),
    )
