"""WordPiece tokenization for BERT checkpoints (the `tokenizers` library, no `transformers`).

Dimensions: B batch, N tokens (after padding to the longest text), C width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit._optional import require
from attnkit.models import checkpoint as ckpt

__all__ = ["Encoding", "Tokenizer", "mean_pool", "sentence_embedding"]

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]")


@dataclass(frozen=True)
class Encoding:
    """A tokenized batch, padded on the right to the longest text.

    input_ids: (B, N) int64.
    attention_mask: (B, N) int64, **1 = real token, 0 = padding** (Hugging Face).
    token_type_ids: (B, N) int64, 0 for the first text, 1 for the pair.
    tokens: B lists of N token strings (padding included, as "[PAD]").
    """

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    tokens: list[list[str]]

    def model_inputs(self) -> dict[str, Tensor]:
        """Keyword arguments for `BertEncoder.forward`."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }


class Tokenizer:
    """A BERT WordPiece tokenizer that adds [CLS]/[SEP] and refuses over-long input.

    Use `Tokenizer.from_pretrained(folder)`; it reads ``tokenizer.json``, or
    falls back to ``vocab.txt`` (lower-casing per ``tokenizer_config.json``).
    """

    def __init__(self, backend, *, max_length: int | None = None) -> None:
        backend.no_truncation()  # too long is an error here, never silently cut
        backend.no_padding()
        self._backend = backend
        self.max_length = max_length
        pad = backend.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, max_length: int | None = None) -> Tokenizer:
        """Load from a checkpoint folder; `max_length` defaults to the config's
        ``max_position_embeddings``."""
        folder = Path(directory)
        if not folder.is_dir():
            raise FileNotFoundError(f"tokenizer folder {str(folder)!r} does not exist")
        if max_length is None and (folder / "config.json").is_file():
            max_length = ckpt.read_config_json(folder / "config.json").get(
                "max_position_embeddings"
            )
        if (folder / "tokenizer.json").is_file():
            tokenizers = require("tokenizers", "model", "reading tokenizer.json")
            return cls(
                tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")),
                max_length=max_length,
            )
        if (folder / "vocab.txt").is_file():
            impl = require("tokenizers.implementations", "model", "reading vocab.txt")
            BertWordPieceTokenizer = impl.BertWordPieceTokenizer

            settings = folder / "tokenizer_config.json"
            lower = True
            if settings.is_file():
                lower = bool(ckpt.read_config_json(settings).get("do_lower_case", True))
            backend = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lower)
            return cls(backend, max_length=max_length)
        raise FileNotFoundError(
            f"tokenizer folder {str(folder)!r} has neither tokenizer.json nor vocab.txt"
        )

    def tokenize(self, text: str) -> list[str]:
        """The word pieces of `text`, without [CLS]/[SEP] (e.g. "didn't" -> didn, ', t)."""
        return list(self._backend.encode(text, add_special_tokens=False).tokens)

    def encode(self, text: str, pair: str | None = None) -> Encoding:
        """One text (and optionally its pair, segment 1) as a batch of one: (1, N)."""
        return self.encode_batch([text], None if pair is None else [pair])

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> Encoding:
        """B texts (and B pairs) -> an `Encoding` padded to the longest: (B, N)."""
        if isinstance(texts, str):
            raise ValueError("texts must be a list of strings; use encode() for one text")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"pairs must have one entry per text ({len(texts)}), got {len(pairs)}")
        for i, t in enumerate(list(texts) + list(pairs or [])):
            if not isinstance(t, str) or not t.strip():
                which = f"texts[{i}]" if i < len(texts) else f"pairs[{i - len(texts)}]"
                raise ValueError(f"{which} is empty: wanted some text to tokenize")
        inputs = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
        encoded = self._backend.encode_batch(inputs)
        for i, e in enumerate(encoded):
            if self.max_length is not None and len(e.ids) > self.max_length:
                raise ValueError(
                    f"text {i} has {len(e.ids)} tokens ([CLS]/[SEP] included) but the model "
                    f"takes at most {self.max_length} (max_position_embeddings): shorten it"
                )
        n = max(len(e.ids) for e in encoded)
        ids = torch.full((len(encoded), n), self.pad_id, dtype=torch.long)  # (B, N)
        keep = torch.zeros((len(encoded), n), dtype=torch.long)  # (B, N)
        types = torch.zeros((len(encoded), n), dtype=torch.long)  # (B, N)
        tokens = []
        for i, e in enumerate(encoded):
            m = len(e.ids)
            ids[i, :m] = torch.tensor(e.ids)
            keep[i, :m] = 1
            types[i, :m] = torch.tensor(e.type_ids)
            tokens.append(list(e.tokens) + ["[PAD]"] * (n - m))
        return Encoding(ids, keep, types, tokens)


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of the real tokens' vectors: hidden (B, N, C), attention_mask (B, N) 1 = keep -> (B, C).

    The pooling of sentence-transformers' all-MiniLM-L6-v2 (``pooling_mode_mean_tokens``).
    """
    if hidden.dim() != 3 or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"mean_pool: wanted hidden (B, N, C) and attention_mask (B, N), got "
            f"{tuple(hidden.shape)} and {tuple(attention_mask.shape)}"
        )
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, N, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def sentence_embedding(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """`mean_pool` then L2 normalisation: (B, N, C), (B, N) -> (B, C) unit vectors."""
    return F.normalize(mean_pool(hidden, attention_mask), p=2, dim=-1)
