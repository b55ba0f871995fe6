"""Saving a `BertEncoder` (or `BertClassifier`) as a transformers checkpoint folder, and
resizing its token embedding.

The folder is what ``transformers.BertModel.save_pretrained`` writes: ``config.json``
in transformers' ``BertConfig`` schema, ``model.safetensors`` with ``BertModel``'s tensor
names (the table in `attnkit.models.bert`; our fused q/k/v rows split back into
``query``, ``key``, ``value``), and the tokenizer files. It is written all or nothing
(`attnkit.models.checkpoint.write_folder`).
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit._optional import require
from attnkit.models import checkpoint as ckpt
from attnkit.models.bert_config import QKV, BertConfig
from attnkit.modules._checks import positive_int

__all__ = ["TOKENIZER_FILES", "config_dict", "hf_state", "resize_token_embeddings", "save"]

# Copied from the folder a model was loaded from when no Tokenizer is given.
# sentence_bert_config.json is not a tokenizer file, but it holds the length limit
# sentence-transformers embeds with (see attnkit.models.tokenize).
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "sentence_bert_config.json",
)


def hf_state(model: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    """The encoder's tensors under transformers' ``BertModel`` names (with `prefix`, e.g.
    ``"bert."`` inside a task model): contiguous copies that share no memory."""
    kind = model.config.position_embedding_type
    if kind != "absolute":
        raise ValueError(
            f"position_embedding_type {kind!r} is attnkit's own: transformers' BertModel "
            "has no such positions, so the model cannot be saved as its checkpoint (save "
            "the state_dict with torch.save instead)"
        )
    ours = model.state_dict()
    out = {}
    for at, hf in ckpt.hf_names(len(model.layers), model.pooler is not None).items():
        out[prefix + hf] = ours[at]
    for i in range(len(model.layers)):
        hf = f"{prefix}encoder.layer.{i}.attention.self."
        for p in ("weight", "bias"):
            fused = ours[f"layers.{i}.attn.fn.in_proj.qkv.{p}"]  # (3C, C) or (3C,)
            for name, part in zip(QKV, fused.chunk(3), strict=True):  # each (C, C) or (C,)
                out[f"{hf}{name}.{p}"] = part
    # safetensors refuses tensors that share storage (the q/k/v chunks do)
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in out.items()}


def config_dict(config: BertConfig, architecture: str, dtype: torch.dtype) -> dict:
    """``config.json`` contents in transformers' ``BertConfig`` schema."""
    data = {"architectures": [architecture]}
    data.update({f.name: getattr(config, f.name) for f in fields(config)})
    data["dtype"] = str(dtype).removeprefix("torch.")
    return data


def _safetensors_bytes(state: dict[str, Tensor]) -> bytes:
    st = require("safetensors.torch", "model", "saving a checkpoint as .safetensors")
    # transformers refuses a safetensors file without this metadata
    return st.save(state, metadata={"format": "pt"})


def tokenizer_files(model: nn.Module, tokenizer) -> dict[str, bytes]:
    """`tokenizer`'s files, else those of the folder `model` was loaded from, else none."""
    if tokenizer is not None:
        return tokenizer.files()
    source = getattr(model, "source_folder", None)
    if source is None:
        return {}
    return {n: (source / n).read_bytes() for n in TOKENIZER_FILES if (source / n).is_file()}


def save_files(directory: str | Path, state: dict[str, Tensor], config: dict, extra: dict):
    """Write config.json, model.safetensors and `extra` (name -> bytes) all or nothing."""
    files = {
        "config.json": (json.dumps(config, indent=2) + "\n").encode(),
        "model.safetensors": _safetensors_bytes(state),
        **extra,
    }
    return ckpt.write_folder(directory, files)


def save(model: nn.Module, directory: str | Path, *, tokenizer=None) -> Path:
    """`BertEncoder.save_pretrained`."""
    dtype = next(model.parameters()).dtype
    config = config_dict(model.config, "BertModel", dtype)
    return save_files(directory, hf_state(model), config, tokenizer_files(model, tokenizer))


@torch.no_grad()
def resize_token_embeddings(model: nn.Module, num_tokens: int, *, mean_resizing: bool) -> None:
    """`BertEncoder.resize_token_embeddings`."""
    positive_int("num_tokens", num_tokens)
    pad = model.config.pad_token_id
    if pad is not None and num_tokens <= pad:
        raise ValueError(
            f"num_tokens={num_tokens} would drop the padding row pad_token_id={pad}: "
            f"wanted num_tokens > {pad}"
        )
    old = model.embeddings.word.weight  # (V, C)
    v, c = old.shape
    new = torch.empty(num_tokens, c, device=old.device, dtype=old.dtype)  # (V', C)
    keep = min(v, num_tokens)
    new[:keep] = old[:keep]
    if num_tokens > v:
        if mean_resizing:
            # transformers' default (the vocabulary-expansion note of Hewitt 2021): new
            # words start at the mean embedding, so outputs barely move
            new[v:] = old.float().mean(0).to(old.dtype)
        else:
            new[v:].normal_(0.0, model.config.initializer_range)
    model.embeddings.word.weight = nn.Parameter(new, requires_grad=old.requires_grad)
    model.embeddings.word.num_embeddings = num_tokens
    model.config = replace(model.config, vocab_size=num_tokens)
