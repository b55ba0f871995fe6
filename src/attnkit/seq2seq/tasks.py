"""Synthetic sequence-to-sequence tasks, generated on the fly from a seed.

Tasks: ``copy``, ``reverse``, ``sort`` (random symbol sequences of length
min_len..max_len over `num_symbols` letters) and ``add`` (``123+45`` -> ``168``,
numbers of 1..max_digits digits).

Token ids: 0 PAD, 1 BOS, 2 EOS, then the task's symbols. A source is
``symbols EOS``; a target is ``BOS symbols EOS``; batches are padded on the
right with PAD to (B, S) and (B, T).

Held-out examples are disjoint from training ones by construction: an example
whose source hashes to 0 mod 10 (CRC-32) belongs to the held-out split and is
never drawn for training.
"""

from __future__ import annotations

import random
import string
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "TASKS",
    "Task",
    "TaskDataset",
    "collate",
    "exact_match",
    "heldout",
    "make_batch",
    "pad_batch",
    "strip",
]

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
TASKS = ("copy", "reverse", "sort", "add")
_HELDOUT_BUCKETS = 10


@dataclass(frozen=True)
class Task:
    """A task and its sizes; `vocab` lists the token strings by id."""

    name: str  # one of TASKS
    min_len: int = 10  # shortest sequence (copy/reverse/sort)
    max_len: int = 20  # longest sequence (copy/reverse/sort)
    num_symbols: int = 16  # alphabet size, letters a.. (copy/reverse/sort), at most 26
    max_digits: int = 5  # longest operand (add)

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.name!r}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(
                f"need 1 <= min_len <= max_len, got min_len={self.min_len}, max_len={self.max_len}"
            )
        if not 2 <= self.num_symbols <= 26:
            raise ValueError(f"num_symbols must be in [2, 26], got {self.num_symbols}")
        if self.max_digits < 1:
            raise ValueError(f"max_digits must be >= 1, got {self.max_digits}")

    @property
    def symbols(self) -> tuple[str, ...]:
        if self.name == "add":
            return (*string.digits, "+")
        return tuple(string.ascii_lowercase[: self.num_symbols])

    @property
    def vocab(self) -> tuple[str, ...]:
        return SPECIALS + self.symbols

    @property
    def longest_source(self) -> int:
        """Longest source in tokens, EOS included."""
        return (2 * self.max_digits + 1 if self.name == "add" else self.max_len) + 1

    @property
    def longest_target(self) -> int:
        """Longest target in tokens, BOS and EOS included."""
        return (self.max_digits + 1 if self.name == "add" else self.max_len) + 2

    def to_dict(self) -> dict:
        return asdict(self)

    def encode(self, text: str) -> list[int]:
        """'cab' or 'c a b' -> symbol ids (no EOS). Raises ValueError on unknown symbols."""
        ids = {s: i for i, s in enumerate(self.vocab)}
        chars = [c for c in text if not c.isspace()]
        unknown = sorted({c for c in chars if c not in ids or ids[c] < len(SPECIALS)})
        if unknown:
            raise ValueError(
                f"sequence {text!r} has symbols {unknown} outside the {self.name} task's "
                f"alphabet {''.join(self.symbols)!r}"
            )
        return [ids[c] for c in chars]

    def decode(self, ids: Iterable[int]) -> str:
        """Symbol ids -> text, stopping at EOS and skipping PAD/BOS."""
        return "".join(self.vocab[i] for i in strip(ids))

    def sample(self, rng: random.Random) -> tuple[list[int], list[int]]:
        """One example: source symbol ids and target symbol ids (no specials)."""
        first = len(SPECIALS)
        if self.name == "add":
            a, b = (rng.randrange(10 ** rng.randint(1, self.max_digits)) for _ in range(2))
            return self.encode(f"{a}+{b}"), self.encode(str(a + b))
        n = rng.randint(self.min_len, self.max_len)
        src = [rng.randrange(first, first + self.num_symbols) for _ in range(n)]
        if self.name == "reverse":
            return src, src[::-1]
        if self.name == "sort":
            return src, sorted(src)
        return src, list(src)

    def draw(self, rng: random.Random, split: str) -> tuple[list[int], list[int]]:
        """`sample` until the example falls in `split` ("train" or "heldout")."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        while True:
            src, tgt = self.sample(rng)
            if _is_heldout(src) == (split == "heldout"):
                return src, tgt


def _is_heldout(src: Sequence[int]) -> bool:
    return zlib.crc32(bytes(src)) % _HELDOUT_BUCKETS == 0


def pad_batch(rows: Sequence[Sequence[int]], *, pad: int = PAD) -> Tensor:
    """Lists of ids -> (B, L) long tensor padded on the right, L = longest row."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def collate(pairs: Sequence[tuple[list[int], list[int]]]) -> tuple[Tensor, Tensor]:
    """(source ids, target ids) pairs -> src (B, S) and tgt (B, T).

    src rows are ``symbols EOS PAD...``, tgt rows ``BOS symbols EOS PAD...``.
    """
    src = pad_batch([[*s, EOS] for s, _ in pairs])  # (B, S)
    tgt = pad_batch([[BOS, *t, EOS] for _, t in pairs])  # (B, T)
    return src, tgt


def make_batch(
    task: Task, rng: random.Random, batch_size: int, split: str = "train"
) -> tuple[Tensor, Tensor]:
    """A batch drawn with `rng`.

    Returns src (B, S) = symbols EOS PAD... and tgt (B, T) = BOS symbols EOS PAD...
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return collate([task.draw(rng, split) for _ in range(batch_size)])


class TaskDataset(torch.utils.data.Dataset):
    """A map-style view of a task: item i of epoch e is drawn from
    `random.Random(f"{seed}:{e}:{i}")`.

    For loops that want a `Dataset` and a `collate_fn` (`collate`) instead of a
    stream, e.g. `attnkit.train.fit`, which shards the indices over DDP ranks and
    calls `set_epoch` before every pass, so each epoch brings `size` new
    examples. Items are pairs of symbol-id lists; the split is as in `Task.draw`.
    """

    def __init__(self, task: Task, size: int, *, seed: int = 0, split: str = "train") -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.task, self.size, self.seed, self.split = task, size, seed, split
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        if not 0 <= i < self.size:
            raise IndexError(f"index {i} out of range for a TaskDataset of size {self.size}")
        return self.task.draw(random.Random(f"{self.seed}:{self.epoch}:{i}"), self.split)


def heldout(task: Task, n: int, seed: int = 1234) -> tuple[Tensor, Tensor]:
    """A fixed held-out set of `n` examples: src (n, S), tgt (n, T)."""
    return make_batch(task, random.Random(seed), n, split="heldout")


def strip(ids: Iterable[int]) -> list[int]:
    """Ids up to (not including) the first EOS, without PAD and BOS."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i not in (PAD, BOS):
            out.append(i)
    return out


def exact_match(pred: Tensor, tgt: Tensor) -> Tensor:
    """Per-row exact sequence match (B,) bool.

    pred: (B, T') decoded ids without BOS (as `greedy` returns); tgt: (B, T)
    targets as built by `make_batch` (BOS ... EOS PAD...). Rows are compared up
    to their first EOS; a prediction that never emits EOS does not match.
    """
    if pred.shape[0] != tgt.shape[0]:
        raise ValueError(
            f"pred and tgt must have the same batch size, got {pred.shape[0]} and {tgt.shape[0]}"
        )
    rows = []
    for p, t in zip(pred.tolist(), tgt.tolist(), strict=True):
        rows.append(EOS in p and strip(p) == strip(t))
    return torch.tensor(rows, dtype=torch.bool)
