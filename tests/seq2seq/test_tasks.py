from __future__ import annotations

import random

import pytest
import torch

from attnkit.seq2seq.tasks import (
    BOS,
    EOS,
    PAD,
    Task,
    TaskDataset,
    collate,
    exact_match,
    heldout,
    make_batch,
    strip,
)


@pytest.mark.parametrize("name", ["copy", "reverse", "sort", "add"])
def test_batches_are_deterministic_from_the_seed(name):
    task = Task(name)
    a = make_batch(task, random.Random(5), 8)
    b = make_batch(task, random.Random(5), 8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c = make_batch(task, random.Random(6), 8)
    assert not torch.equal(a[0], c[0])


def _pairs(task, n=64, seed=0):
    src, tgt = make_batch(task, random.Random(seed), n)
    return [
        (task.decode(s), task.decode(t)) for s, t in zip(src.tolist(), tgt.tolist(), strict=True)
    ]


def test_reverse_copy_sort_targets_and_lengths():
    for name, fn in (("reverse", lambda s: s[::-1]), ("copy", str), ("sort", sorted)):
        task = Task(name, min_len=10, max_len=20, num_symbols=12)
        for s, t in _pairs(task):
            assert t == "".join(fn(s))
            assert 10 <= len(s) <= 20
            assert set(s) <= set("abcdefghijkl")


def test_add_targets_are_sums():
    task = Task("add", max_digits=4)
    for s, t in _pairs(task):
        a, b = s.split("+")
        assert int(t) == int(a) + int(b) and len(a) <= 4 and len(b) <= 4


def test_layout_bos_eos_pad():
    task = Task("reverse", min_len=2, max_len=6, num_symbols=4)
    src, tgt = make_batch(task, random.Random(1), 16)
    for s, t in zip(src.tolist(), tgt.tolist(), strict=True):
        n = len(strip(s))
        assert s[n] == EOS and all(x == PAD for x in s[n + 1 :])
        assert t[0] == BOS and t[n + 1] == EOS and all(x == PAD for x in t[n + 2 :])
    assert src.shape[1] == int((src != PAD).sum(1).max())  # padded to the longest row only


def test_heldout_is_disjoint_from_training():
    task = Task("reverse", min_len=3, max_len=4, num_symbols=4)  # small space: collisions likely
    train = {tuple(strip(s)) for s in make_batch(task, random.Random(0), 2000)[0].tolist()}
    held = {tuple(strip(s)) for s in heldout(task, 200)[0].tolist()}
    assert held and train and not (held & train)


def test_encode_decode_and_errors():
    task = Task("reverse", num_symbols=5)
    assert task.decode(task.encode("a b e")) == "abe"
    with pytest.raises(ValueError, match=r"symbols \['z'\] outside the reverse task's alphabet"):
        task.encode("az")
    with pytest.raises(ValueError, match="task must be one of"):
        Task("rotate")
    with pytest.raises(ValueError, match="min_len=5, max_len=3"):
        Task("copy", min_len=5, max_len=3)
    with pytest.raises(ValueError, match="num_symbols must be in"):
        Task("copy", num_symbols=40)


def test_exact_match_compares_up_to_eos():
    tgt = torch.tensor([[BOS, 5, 6, EOS, PAD], [BOS, 5, EOS, PAD, PAD], [BOS, 7, EOS, PAD, PAD]])
    pred = torch.tensor([[5, 6, EOS, 9], [5, 6, EOS, PAD], [7, 7, 7, 7]])  # no EOS: no match
    assert exact_match(pred, tgt).tolist() == [True, False, False]


def test_task_dataset_is_deterministic_and_collates():
    task = Task("sort", min_len=2, max_len=5, num_symbols=6)
    ds = TaskDataset(task, 10, seed=3)
    assert len(ds) == 10 and ds[4] == TaskDataset(task, 10, seed=3)[4]
    src, tgt = collate([ds[i] for i in range(4)])
    assert src.shape[0] == tgt.shape[0] == 4 and (tgt[:, 0] == BOS).all()
    with pytest.raises(IndexError):
        ds[10]
    first = ds[4]
    ds.set_epoch(1)
    assert ds[4] != first  # a new epoch draws new examples
    ds.set_epoch(0)
    assert ds[4] == first
