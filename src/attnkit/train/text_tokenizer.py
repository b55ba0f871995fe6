"""The tokenizers of `attnkit lm`: characters, or byte-level BPE trained on the corpus.

Both turn text into ids and back, say how many ids there are, and are saved inside the
checkpoint as a small dict (`state`) that `from_state` reads back, so `attnkit lm sample`
decodes with exactly the tokenizer the model was trained with.

* `CharTokenizer`: one id per distinct character of the training text (sorted); a character it
  never saw cannot be encoded (`unknown` names them).
* `BpeTokenizer`: byte-level BPE (Sennrich et al. 2016; GPT-2's byte-level variant, Radford et
  al. 2019) trained with the `tokenizers` library on the training text: the 256 byte symbols
  plus merges up to `vocab_size`, so any text can be encoded and decoding gives it back exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["BpeTokenizer", "CharTokenizer", "from_state", "train_tokenizer"]

KINDS = ("char", "bpe")


class CharTokenizer:
    kind = "char"

    def __init__(self, vocab: str):
        self.vocab = vocab
        self._index = {ch: i for i, ch in enumerate(vocab)}

    @classmethod
    def train(cls, documents: Iterable[str]) -> CharTokenizer:
        return cls("".join(sorted(set().union(*(set(d) for d in documents)))))

    @property
    def size(self) -> int:
        return len(self.vocab)

    def unknown(self, text: str) -> list[str]:
        """The characters of `text` this tokenizer cannot encode, sorted."""
        return sorted({ch for ch in text if ch not in self._index})

    def encode(self, text: str) -> list[int]:
        return [self._index[ch] for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.vocab[i] for i in ids)

    def state(self) -> dict:
        return {"kind": self.kind, "vocab": self.vocab}


class BpeTokenizer:
    kind = "bpe"

    def __init__(self, tokenizer):
        self._tok = tokenizer

    @classmethod
    def train(cls, documents: Iterable[str], vocab_size: int) -> BpeTokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: nothing unknown
            show_progress=False,
        )
        tok.train_from_iterator(documents, trainer)
        return cls(tok)

    @classmethod
    def from_json(cls, text: str) -> BpeTokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(text))

    @property
    def size(self) -> int:
        return self._tok.get_vocab_size()

    def unknown(self, text: str) -> list[str]:
        return []  # bytes cover everything

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))

    def state(self) -> dict:
        return {"kind": self.kind, "json": self._tok.to_str()}


def train_tokenizer(kind: str, documents: Sequence[str], vocab_size: int = 512):
    """A tokenizer of `kind` ("char" or "bpe") trained on `documents`."""
    if kind == "char":
        return CharTokenizer.train(documents)
    if kind == "bpe":
        if vocab_size < 257:
            raise ValueError(
                f"vocab_size must be at least 257 for byte-level BPE, got {vocab_size}"
            )
        return BpeTokenizer.train(documents, vocab_size)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def from_state(state) -> CharTokenizer | BpeTokenizer:
    """The tokenizer `state()` saved; ValueError when `state` is not one."""
    if isinstance(state, str):  # checkpoints before subword tokenizers held the vocabulary
        return CharTokenizer(state)
    if (
        isinstance(state, dict)
        and state.get("kind") == "char"
        and isinstance(state.get("vocab"), str)
    ):
        return CharTokenizer(state["vocab"])
    if (
        isinstance(state, dict)
        and state.get("kind") == "bpe"
        and isinstance(state.get("json"), str)
    ):
        try:
            return BpeTokenizer.from_json(state["json"])
        except Exception as err:  # tokenizers raises its own Exception type
            raise ValueError(f"the saved BPE tokenizer does not load ({err})") from None
    raise ValueError("not a saved attnkit lm tokenizer")
