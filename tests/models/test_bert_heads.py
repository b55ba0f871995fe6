"""BertClassifier against transformers.BertForSequenceClassification (random weights)."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.models import BertClassifier, BertConfig, BertEncoder
from tests.models.tiny import TINY, tiny_batch

transformers = pytest.importorskip("transformers")

LOGIT_TOL = 1e-5  # float32, issue 21


@pytest.fixture
def hf_classifier(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(**TINY, num_labels=3, id2label={0: "neg", 1: "mid", 2: "pos"})
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "hf")
    return model, tmp_path / "hf"


def test_logits_match_and_save_back(hf_classifier, tmp_path):
    theirs, folder = hf_classifier
    ours = BertClassifier.from_pretrained(folder)
    assert ours.num_labels == 3 and ours.id2label == {0: "neg", 1: "mid", 2: "pos"}
    batch = tiny_batch()
    with torch.no_grad():
        a = ours(**batch)
        b = theirs(**batch).logits
    assert a.shape == (4, 3)
    assert float((a - b).abs().max()) <= LOGIT_TOL
    saved = ours.save_pretrained(tmp_path / "ours")
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "neg", "1": "mid", "2": "pos"}
    again = transformers.AutoModelForSequenceClassification.from_pretrained(str(saved)).eval()
    reloaded = BertClassifier.from_pretrained(saved)
    with torch.no_grad():
        assert torch.equal(again(**batch).logits, b)  # transformers sees its own model
        assert torch.equal(reloaded(**batch), a)
    # the encoder part alone is a BertModel folder for both libraries
    encoder = BertEncoder.from_pretrained(saved)
    with torch.no_grad():
        pooled = encoder(**batch).pooler_output
    assert torch.equal(ours.classifier(pooled), a)


@pytest.mark.parametrize(
    ("num_labels", "labels"),
    [
        (3, torch.tensor([0, 2, 1, 2])),  # integer ids: single-label cross-entropy
        (1, torch.tensor([0.5, -1.0, 2.0, 0.0])),  # one label: regression (MSE)
        (3, torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]])),  # multi-label
    ],
    ids=["single_label", "regression", "multi_label"],
)
def test_loss_follows_transformers_problem_type_rules(tmp_path, num_labels, labels):
    torch.manual_seed(0)
    config = transformers.BertConfig(**TINY, num_labels=num_labels)
    theirs = transformers.BertForSequenceClassification(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = BertClassifier.from_pretrained(tmp_path)
    batch = tiny_batch()
    with torch.no_grad():
        expected = theirs(**batch, labels=labels)
        loss = ours.loss(ours(**batch), labels)
    assert expected.loss is not None and theirs.config.problem_type is not None
    assert float((loss - expected.loss).abs()) <= LOGIT_TOL
    # the problem type transformers settled on, given explicitly, gives the same loss
    fixed = BertClassifier.from_pretrained(tmp_path, problem_type=theirs.config.problem_type)
    with torch.no_grad():
        assert torch.equal(fixed.loss(fixed(**batch), labels), loss)


def test_ignored_labels_and_bad_labels():
    torch.manual_seed(0)
    model = BertClassifier(BertConfig(**TINY), 3)
    logits = torch.randn(2, 3, requires_grad=True)
    loss = model.loss(logits, torch.tensor([-100, -100]))
    assert float(loss.detach()) == 0.0  # not NaN: nothing to learn from
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"logits must have shape \(B, 3\), got \(2, 4\)"):
        model.loss(torch.randn(2, 4), torch.tensor([0, 1]))
    logits = torch.randn(2, 3)
    # transformers flattens the labels (labels.view(-1)): (B, 1) class ids are (B,)
    assert torch.equal(
        model.loss(logits, torch.tensor([[0], [1]])), model.loss(logits, torch.tensor([0, 1]))
    )
    assert model.problem_type == "single_label_classification"  # chosen by the first loss, kept
    with pytest.raises(ValueError, match=r"labels must be \(2,\) class ids"):
        model.loss(logits, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="shape of logits"):
        BertClassifier(BertConfig(**TINY), 3).loss(logits, torch.rand(2, 2))
    with pytest.raises(ValueError, match="problem_type 'ranking' is unknown"):
        BertClassifier(BertConfig(**TINY), 3, problem_type="ranking")
    with pytest.raises(ValueError, match="num_labels must be a positive integer"):
        BertClassifier(BertConfig(**TINY), 0)


def test_new_head_on_an_encoder_checkpoint(tmp_path):
    torch.manual_seed(0)
    encoder = BertEncoder(BertConfig(**TINY, initializer_range=0.05, classifier_dropout=0.3))
    encoder.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no classifier weights.*start new \\(400 labels\\)"):
        model = BertClassifier.from_pretrained(tmp_path, num_labels=400)
    w = model.classifier.weight.detach()  # (400, 32)
    assert abs(float(w.std()) - 0.05) < 0.003 and not model.classifier.bias.any()
    assert model.drop.p == 0.3 and not model.training
    batch = tiny_batch()
    with torch.no_grad():
        pooled = encoder.eval()(**batch).pooler_output
        assert torch.equal(model(**batch), model.classifier(pooled))
    with pytest.warns(UserWarning):
        assert BertClassifier.from_pretrained(tmp_path).num_labels == 2  # transformers' default


def test_head_of_another_size_is_refused(hf_classifier):
    _, folder = hf_classifier
    with pytest.raises(
        ValueError, match=r"'classifier.weight' has shape \(3, 32\), wanted \(5, 32\)"
    ):
        BertClassifier.from_pretrained(folder, num_labels=5)


def _without_and_with_checkpointing(folder):
    """The classifier in training mode with dropout off, without then with checkpointing."""
    for checkpointing in (False, True):
        yield BertClassifier.from_pretrained(
            folder, gradient_checkpointing=checkpointing, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ).train()  # fmt: skip


def test_fine_tune_step_with_checkpointing_matches_plain(hf_classifier):
    _, folder = hf_classifier
    batch, labels = tiny_batch(), torch.tensor([0, 1, 2, 1])
    grads = []
    for model in _without_and_with_checkpointing(folder):
        model.loss(model(**batch), labels).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=0, atol=1e-6, msg=name)


def test_recording_a_checkpointed_step_lists_each_layer_once(hf_classifier):
    """The backward pass recomputes checkpointed layers; the recording keeps the forward's maps
    only (it listed every layer twice), and they equal an unchecked model's."""
    from attnkit import record_attention

    _, folder = hf_classifier
    batch, labels = tiny_batch(), torch.tensor([0, 1, 2, 1])
    recorded = []
    for model in _without_and_with_checkpointing(folder):
        with record_attention(model) as rec:
            model.loss(model(**batch), labels).backward()
        assert all(len(maps) == 1 for maps in rec.calls.values()) and len(rec) == 2
        recorded.append(rec)
    for name in recorded[0].names:
        torch.testing.assert_close(recorded[1][name], recorded[0][name], rtol=0, atol=1e-7)
