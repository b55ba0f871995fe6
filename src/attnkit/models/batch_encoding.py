"""What `Tokenizer.__call__` returns and the options it reads, as transformers names them.

Dimensions: B batch, N tokens.

`BatchEncoding` is a dict (``enc["input_ids"]``, ``model(**enc)``) whose keys are also
attributes (``enc.input_ids``), like transformers' ``BatchEncoding``. `assemble` turns the
encodings of the `tokenizers` library into it: padding on the right with the pad id,
segment 0 and mask 0, as transformers' tokenizers pad for BERT.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["PADDING", "TRUNCATION", "BatchEncoding", "assemble", "option"]

# transformers' padding / truncation arguments -> the strategy they mean (None: off)
PADDING = {False: None, "do_not_pad": None, True: "longest", "longest": "longest",
           "max_length": "max_length"}  # fmt: skip
TRUNCATION = {False: None, "do_not_truncate": None, True: "longest_first",
              "longest_first": "longest_first", "only_first": "only_first",
              "only_second": "only_second"}  # fmt: skip
KEYS = ("input_ids", "token_type_ids", "attention_mask")  # transformers' order for BERT


def option(name: str, value, table: dict):
    """The strategy `value` means in `table`; ValueError naming the known ones."""
    if isinstance(value, (bool, str)) and value in table:
        return table[value]
    known = ", ".join(repr(k) for k in table)
    raise ValueError(f"{name}={value!r} is unknown: wanted one of {known}")


class BatchEncoding(dict):
    """Tokenized text: ``input_ids``, ``token_type_ids`` (0 first text, 1 its pair) and
    ``attention_mask`` (1 = real token, 0 = padding), each (B, N) tensors with
    ``return_tensors="pt"``, else lists (flat for one text, a list per text for a batch).

    A dict, so ``model(**enc)`` passes them by name; each key is also an attribute.
    `tokens(i)` gives text i's token strings.
    """

    def __init__(self, data: dict, tokens: list[list[str]]) -> None:
        super().__init__(data)
        self._tokens = tokens

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"BatchEncoding has no {name!r}: keys {list(self)}") from None

    def tokens(self, batch_index: int = 0) -> list[str]:
        """Text `batch_index`'s token strings, padding included (as the pad token)."""
        return list(self._tokens[batch_index])

    def to(self, device: torch.device | str) -> BatchEncoding:
        """The tensors moved to `device` (lists stay)."""
        data = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in self.items()}
        return BatchEncoding(data, self._tokens)


def assemble(encoded, *, single: bool, pad_to: int | None, pad_id: int, pad_token: str,
             keys: tuple[str, ...], tensors: bool) -> BatchEncoding:  # fmt: skip
    """`tokenizers` encodings -> a `BatchEncoding` with `keys`, each row padded on the right
    to `pad_to` tokens (None: not padded; rows already longer stay as they are)."""
    rows = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    tokens = []
    for e in encoded:
        extra = max(0, (pad_to or 0) - len(e.ids))
        rows["input_ids"].append(list(e.ids) + [pad_id] * extra)
        rows["token_type_ids"].append(list(e.type_ids) + [0] * extra)
        rows["attention_mask"].append([1] * len(e.ids) + [0] * extra)
        tokens.append(list(e.tokens) + [pad_token] * extra)
    data = {k: rows[k] for k in KEYS if k in keys}
    if tensors:
        lengths = sorted({len(r) for r in rows["input_ids"]})
        if len(lengths) > 1:
            raise ValueError(
                f"return_tensors='pt' needs texts of one length, got lengths {lengths}: "
                "pass padding=True (and truncation=True for texts over the limit)"
            )
        data = {k: torch.tensor(v, dtype=torch.long) for k, v in data.items()}  # (B, N)
    elif single:
        data = {k: v[0] for k, v in data.items()}
    return BatchEncoding(data, tokens)
