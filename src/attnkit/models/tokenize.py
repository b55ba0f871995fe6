"""WordPiece tokenization for BERT checkpoints (the `tokenizers` library, no `transformers`).

Dimensions: B batch, N tokens (after padding to the longest text), C width.

The length limit comes from the checkpoint folder, the strictest of:

- ``max_seq_length`` in ``sentence_bert_config.json`` (sentence-transformers cuts its
  input there: all-MiniLM-L6-v2 says 256, so its embeddings of longer texts come from
  the first 256 tokens; to equal them we must cut, or refuse, at the same place),
- ``model_max_length`` in ``tokenizer_config.json`` (transformers' tokenizer limit; its
  "no limit" placeholder, a number near 1e30, is ignored),
- ``max_position_embeddings`` in ``config.json`` (the model has no positions beyond it).

Too long is an error (`TextTooLong`, a ValueError giving the token count, the limit, the
file and field it came from, and the option) unless the tokenizer was made with
``truncation=True``, which keeps the first tokens as transformers' ``longest_first`` does.
Pass ``max_length=`` to use another limit (e.g. up to ``max_position_embeddings`` for
attention maps of a text longer than sentence-transformers would embed).

Called like transformers' tokenizer, ``tok(texts, padding=True, truncation=True,
return_tensors="pt")`` gives the ids ``transformers.AutoTokenizer`` gives for the same
folder, with transformers' rules instead: its default limit is ``model_max_length`` (in
``tokenizer_config.json``; 512 for all-MiniLM-L6-v2, not sentence-transformers' 256), and
without truncation a longer text is kept whole, with a warning.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit._optional import require
from attnkit.models import checkpoint as ckpt
from attnkit.models.batch_encoding import PADDING, TRUNCATION, BatchEncoding, assemble, option
from attnkit.modules._checks import positive_int

__all__ = ["BatchEncoding", "Encoding", "TextTooLong", "Tokenizer", "checkpoint_max_length",
           "mean_pool", "sentence_embedding"]  # fmt: skip

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]")

# transformers writes int(1e30) as model_max_length when a tokenizer has no limit
NO_LIMIT = 10**12


class TextTooLong(ValueError):
    """A text with more tokens than the tokenizer's limit (and ``truncation=False``).

    index: which text of the batch; count: its tokens, [CLS]/[SEP] included;
    limit: the most allowed; source: where the limit came from (file and field).
    """

    def __init__(self, index: int, count: int, limit: int, source: str) -> None:
        self.index, self.count, self.limit, self.source = index, count, limit, source
        super().__init__(
            f"text {index} has {count} tokens ([CLS]/[SEP] included) but the limit is "
            f"{limit} ({source}): shorten it, or make the Tokenizer with truncation=True "
            f"to keep the first {limit}"
        )


def _limit(folder: Path, file: str, key: str) -> int | None:
    """`key` of the JSON `file` in `folder` when it is a real limit, else None."""
    if not (folder / file).is_file():
        return None
    value = ckpt.read_config_json(folder / file).get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < NO_LIMIT:
        return value
    return None


def checkpoint_max_length(directory: str | Path) -> tuple[int, str] | None:
    """(limit, where it came from) for a checkpoint folder: the strictest of the limits in
    the module docstring, or None if the folder states none."""
    folder = Path(directory)
    found = []
    for file, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
        ("config.json", "max_position_embeddings"),
    ):
        value = _limit(folder, file, key)
        if value is not None:
            found.append((value, f"{key} in {file}"))
    return min(found, key=lambda f: f[0]) if found else None


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
    """A BERT WordPiece tokenizer that adds [CLS]/[SEP] and refuses (or, with
    `truncation`, cuts) input longer than `max_length` tokens, [CLS]/[SEP] included.

    Use `Tokenizer.from_pretrained(folder)`; it reads ``tokenizer.json``, or
    falls back to ``vocab.txt`` (lower-casing per ``tokenizer_config.json``), and
    takes its limit from the folder (module docstring). `limit_source` names where
    `max_length` came from, for error messages. `model_max_length` (default `max_length`) is
    the limit of transformers' rules, which calling the tokenizer follows (`__call__`).
    """

    def __init__(
        self,
        backend,
        *,
        max_length: int | None = None,
        truncation: bool = False,
        limit_source: str = "the max_length argument",
        model_max_length: int | None = None,
    ) -> None:
        if max_length is not None:
            positive_int("max_length", max_length)
        if truncation and max_length is None:
            raise ValueError("truncation=True needs a max_length to cut to, got None")
        self._backend = backend
        self.max_length = max_length
        self.truncation = bool(truncation)
        self._configure()
        self.limit_source = limit_source
        self.model_max_length = max_length if model_max_length is None else model_max_length
        self.source_folder: Path | None = None  # set by from_pretrained; files() copies from it
        pad = backend.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad

    def _configure(self, cut: str | None = None, limit: int | None = None) -> None:
        """Set the backend's truncation: `cut` (a strategy) at `limit` for one call, else
        this tokenizer's own (no padding: the batch is padded here)."""
        self._backend.no_padding()
        if cut is not None:
            self._backend.enable_truncation(limit, strategy=cut)
        elif self.truncation:
            # transformers' default strategy: drop tokens from the longer of a pair first
            self._backend.enable_truncation(self.max_length, strategy="longest_first")
        else:
            self._backend.no_truncation()  # too long is an error here, never silently cut

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, *, max_length: int | None = None, truncation: bool = False
    ) -> Tokenizer:
        """Load from a checkpoint folder; `max_length` defaults to the folder's limit
        (`checkpoint_max_length`); `truncation=True` cuts longer texts to it."""
        folder = Path(directory)
        if not folder.is_dir():
            raise FileNotFoundError(f"tokenizer folder {str(folder)!r} does not exist")
        source = "the max_length argument"
        model_max = max_length
        if max_length is None:
            max_length, source = checkpoint_max_length(folder) or (None, source)
            model_max = _limit(folder, "tokenizer_config.json", "model_max_length") or max_length
        options = {"max_length": max_length, "truncation": truncation, "limit_source": source,
                   "model_max_length": model_max}  # fmt: skip
        tokenizer = cls._load(folder, options)
        tokenizer.source_folder = folder
        return tokenizer

    @classmethod
    def _load(cls, folder: Path, options: dict) -> Tokenizer:
        if (folder / "tokenizer.json").is_file():
            tokenizers = require("tokenizers", "model", "reading tokenizer.json")
            path = folder / "tokenizer.json"
            try:
                backend = tokenizers.Tokenizer.from_file(str(path))
            except Exception as e:  # tokenizers raises plain Exception, naming no file
                raise ckpt.CheckpointError(f"{path}: not a readable tokenizer file ({e})") from e
            return cls(backend, **options)
        if (folder / "vocab.txt").is_file():
            impl = require("tokenizers.implementations", "model", "reading vocab.txt")
            BertWordPieceTokenizer = impl.BertWordPieceTokenizer

            settings = folder / "tokenizer_config.json"
            lower = True
            if settings.is_file():
                lower = bool(ckpt.read_config_json(settings).get("do_lower_case", True))
            backend = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lower)
            return cls(backend, **options)
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
        try:
            encoded = self._backend.encode_batch(inputs)
        except Exception as e:  # tokenizers raises its own types, e.g. a pair it cannot cut
            raise ValueError(f"cannot tokenize with max_length={self.max_length}: {e}") from e
        for i, e in enumerate(encoded):
            if self.max_length is not None and len(e.ids) > self.max_length:
                if self.truncation:  # cut as far as it goes: [CLS]/[SEP] are never cut
                    raise ValueError(
                        f"max_length={self.max_length} cannot hold text {i} even cut "
                        f"({len(e.ids)} tokens remain): [CLS]/[SEP] alone take 2 (3 with a pair)"
                    )
                raise TextTooLong(i, len(e.ids), self.max_length, self.limit_source)
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

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        add_special_tokens: bool = True,
    ) -> BatchEncoding:
        """Tokenize as transformers' tokenizer does, with its arguments and ids.

        `text` one string or B strings (`text_pair` likewise: segment 1), or B (text, pair)
        tuples. `padding`: False, True / "longest" (to the longest text), "max_length".
        `truncation`: False, True / "longest_first" (cut the longer of a pair first),
        "only_first", "only_second";
        None cuts "longest_first" when `max_length` is given without padding, as
        transformers does. `max_length` counts [CLS]/[SEP] and defaults to
        `model_max_length`. `return_tensors`: None (lists) or "pt" ((B, N) int64 tensors).
        A text longer than `model_max_length` and not cut is kept whole, with a warning.
        """
        single = isinstance(text, str)
        tuples = isinstance(text, (list, tuple)) and text and text_pair is None
        if tuples and all(isinstance(t, (list, tuple)) and len(t) == 2 for t in text):
            text, text_pair = [t[0] for t in text], [t[1] for t in text]  # [(a, b), ...]
        texts = _strings("text", text)
        if single and text_pair == "":
            text_pair = None  # transformers tests `if text_pair`: one empty pair is no pair
        pairs = None if text_pair is None else _strings("text_pair", text_pair)
        if pairs is not None and (isinstance(text_pair, str) != single or len(pairs) != len(texts)):
            raise ValueError(f"text_pair must be like text: one string for a string, one per text "
                             f"for a list ({len(texts)}), got {text_pair!r:.60}")  # fmt: skip
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors={return_tensors!r} is not supported: wanted "
                             "None (lists) or 'pt' (torch tensors)")  # fmt: skip
        if max_length is not None:
            positive_int("max_length", max_length)
        pad = option("padding", padding, PADDING)
        if truncation is None:
            cut = "longest_first" if max_length is not None and pad is None else None
        else:
            cut = option("truncation", truncation, TRUNCATION)
        limit = self.model_max_length if max_length is None else max_length
        if (cut is not None or pad == "max_length") and limit is None:
            raise ValueError("truncation and padding='max_length' need max_length: this "
                             "tokenizer has no model_max_length")  # fmt: skip
        inputs = texts if pairs is None else list(zip(texts, pairs, strict=True))
        self._configure(cut, limit)
        try:
            encoded = self._backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        except Exception as e:  # tokenizers raises plain Exception, e.g. a pair it cannot cut
            raise ValueError(f"cannot tokenize with truncation={cut!r}, max_length={limit}: "
                             f"{e}") from e  # fmt: skip
        finally:
            self._configure()
        longest = max((len(e.ids) for e in encoded), default=0)
        if cut is None and self.model_max_length is not None and longest > self.model_max_length:
            warnings.warn(
                f"a text has {longest} tokens, more than model_max_length="
                f"{self.model_max_length}; pass truncation=True to cut it there",
                stacklevel=2,
            )
        keys = ["input_ids"]
        keys += ["token_type_ids"] if return_token_type_ids in (None, True) else []
        keys += ["attention_mask"] if return_attention_mask in (None, True) else []
        pad_to = {None: None, "longest": longest, "max_length": limit}[pad]
        return assemble(encoded, single=single, pad_to=pad_to, pad_id=self.pad_id,
                        pad_token=self._backend.id_to_token(self.pad_id) or "[PAD]",
                        keys=tuple(keys), tensors=return_tensors == "pt")  # fmt: skip

    def files(self) -> dict[str, bytes]:
        """The files of a transformers tokenizer folder (name -> bytes): tokenizer.json
        from this tokenizer, vocab.txt and special_tokens_map.json copied from the folder
        it was loaded from, tokenizer_config.json with ``model_max_length`` = `max_length`
        (so a reload, here or in transformers, keeps the limit this tokenizer enforces)."""
        backend = getattr(self._backend, "_tokenizer", self._backend)  # vocab.txt fallback wraps
        saved = json.loads(backend.to_str())
        saved["truncation"] = saved["padding"] = None  # both are per-use settings, not the vocab
        out = {"tokenizer.json": json.dumps(saved, ensure_ascii=False).encode()}
        settings = {"tokenizer_class": "BertTokenizer", "do_lower_case": True}
        src = self.source_folder
        if src is not None:
            for name in ("vocab.txt", "special_tokens_map.json"):
                if (src / name).is_file():
                    out[name] = (src / name).read_bytes()
            if (src / "tokenizer_config.json").is_file():
                settings = ckpt.read_config_json(src / "tokenizer_config.json")
        if self.max_length is not None:
            settings["model_max_length"] = self.max_length
        out["tokenizer_config.json"] = (json.dumps(settings, indent=2) + "\n").encode()
        return out

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write `files` into `directory`, all or nothing (`checkpoint.write_folder`)."""
        return ckpt.write_folder(directory, self.files())


def _strings(name: str, value) -> list[str]:
    """One string or a list of strings as a list; ValueError otherwise."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r:.60}")
    if not items:
        raise ValueError(f"{name} is an empty list: wanted at least one text")
    return list(items)


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
