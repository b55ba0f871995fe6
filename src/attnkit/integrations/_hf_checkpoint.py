"""Loading a local transformers checkpoint without explaining random weights.

`from_pretrained` of transformers starts every tensor the model wants but the folder lacks
from random numbers, and skips every tensor the folder holds for no part of the model, with
a warning only: a GPT-2 config.json over BERT weights loads as a random GPT-2. Here the
loading report (``output_loading_info=True``) is checked with
`attnkit.models.checkpoint.check_keys`: a task head or a pooler the model does not use is
tolerated (named there), anything else missing, unexpected or mis-shaped is a
`CheckpointError` naming the folder. `damaged_json` names the file when a tokenizer fails to
load because one of its JSON files is damaged.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attnkit.models.checkpoint import CheckpointError, check_keys

__all__ = ["damaged_json", "from_pretrained_checked"]

# The JSON files a transformers tokenizer folder may hold.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "added_tokens.json")  # fmt: skip


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' own load report (a table of MISSING / UNEXPECTED keys on stderr) off:
    `from_pretrained_checked` says in one line what matters."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def from_pretrained_checked(auto: Any, path: Path, **kwargs: Any) -> Any:
    """``auto.from_pretrained(path, local_files_only=True, **kwargs)`` whose weights are all
    the model's own (see the module docstring); ValueError naming the folder if transformers
    cannot load it, `CheckpointError` if its weights do not fit its config.json."""
    source = f"checkpoint {str(path)!r}"
    try:
        with _quiet():
            model, info = auto.from_pretrained(
                path, local_files_only=True, output_loading_info=True, **kwargs
            )
    except RuntimeError as err:  # transformers' "size mismatch" and conversion errors
        reason = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{source}: the weights do not fit config.json ({reason})") from err
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"checkpoint: cannot load {str(path)!r}: {err}") from err
    mismatched = [str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys", ())]
    if mismatched:
        raise CheckpointError(
            f"{source}: {len(mismatched)} tensors have other shapes than config.json says "
            f"(e.g. {mismatched[0]!r})"
        )
    kind = getattr(model.config, "model_type", "?")
    check_keys(
        source, info["missing_keys"], info["unexpected_keys"], what=f"config.json ({kind!r})"
    )
    return model


def damaged_json(path: Path, names: tuple[str, ...] = TOKENIZER_FILES) -> CheckpointError | None:
    """A `CheckpointError` naming the first of `names` in the folder `path` that is not valid
    JSON (transformers' own error names no file), or None when they all read."""
    for name in names:
        file = path / name
        if not file.is_file():
            continue
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            return CheckpointError(f"{file}: not valid JSON ({e})")
    return None
