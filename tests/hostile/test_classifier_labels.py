"""BertClassifier's labels checked where they enter (issue 39): before, each case below
returned a loss computed on the wrong thing (labels reshaped by their element count, targets
outside [0, 1], one class) or failed inside torch with a message that named neither the
labels nor the argument at fault."""

from __future__ import annotations

import pytest
import torch

from attnkit.models import BertClassifier, BertConfig
from tests.models.tiny import TINY

SMALL = {**TINY, "num_hidden_layers": 1}
IDS = torch.randint(1, TINY["vocab_size"], (4, 7), generator=torch.Generator().manual_seed(0))


def _clf(num_labels=3, **kw) -> BertClassifier:
    torch.manual_seed(0)
    return BertClassifier(BertConfig(**SMALL), num_labels, **kw).eval()


def test_labels_of_another_batch_with_the_same_count_are_refused():
    # (2, 2) holds 4 values like the (4,) a batch of 4 wants: it was reshaped and used
    with pytest.raises(ValueError, match=r"labels must be \(4,\) class ids .* got \(2, 2\)"):
        _clf()(IDS, labels=torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match=r"labels must have shape \(4, 3\) for regression"):
        _clf(problem_type="regression")(IDS, labels=torch.rand(3, 4))


@pytest.mark.parametrize("bad", [5, -1, 3])
def test_class_ids_out_of_range_are_refused_by_name(bad):
    # was IndexError "Target 5 is out of bounds" from cross_entropy
    with pytest.raises(ValueError, match=rf"labels must be class ids in \[0, 2\].*\[{bad}\]"):
        _clf()(IDS, labels=torch.tensor([0, 1, bad, 2]))


def test_ignored_labels_stay_accepted():
    loss = _clf()(IDS, labels=torch.tensor([0, -100, 2, 1])).loss
    assert torch.isfinite(loss)


@pytest.mark.parametrize("bad", [5.0, -0.5, float("nan")])
def test_multi_label_targets_outside_0_1_are_refused(bad):
    labels = torch.tensor([[0.0, 1.0, 0.5]] * 4)
    labels[2, 1] = bad
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 1\] for multi-label"):
        _clf(problem_type="multi_label_classification")(IDS, labels=labels)


def test_one_class_single_label_is_refused():
    # softmax over one logit is 1: the loss was exactly 0 whatever the input
    with pytest.raises(ValueError, match="num_labels must be >= 2 for single_label"):
        _clf(1, problem_type="single_label_classification")


def test_label_names_must_be_distinct():
    # label2id silently became {"a": 1}
    with pytest.raises(ValueError, match="id2label must give distinct names"):
        _clf(2, id2label={0: "a", 1: "a"})


def test_the_wrong_label2id_is_named():
    # the message named id2label, which the caller never passed
    with pytest.raises(ValueError, match=r"^label2id must name labels 0\.\.1, got keys \[0, 7\]"):
        _clf(2, label2id={"a": 0, "b": 7})
