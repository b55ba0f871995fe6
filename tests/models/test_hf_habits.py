"""BertClassifier used with transformers' habits: from_pretrained(num_labels=, id2label=,
label2id=, problem_type=), forward(..., labels=) -> .loss and .logits, and a saved folder
that AutoModelForSequenceClassification reads back with the same names and logits."""

from __future__ import annotations

import io
import json
import warnings

import pytest
import torch

from attnkit.models import BertClassifier, BertConfig, BertEncoder
from attnkit.models.bert_heads import SequenceClassifierOutput
from tests.models.tiny import TINY, tiny_batch

transformers = pytest.importorskip("transformers")


NAMES = {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture
def encoder_folder(tmp_path):
    """A BertModel folder (no classifier): what users start fine-tuning from."""
    torch.manual_seed(0)
    BertEncoder(BertConfig(**TINY), dtype=torch.float64).save_pretrained(tmp_path / "encoder")
    return tmp_path / "encoder"


def _new_head(folder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no classifier weights": a new head
        torch.manual_seed(3)
        return BertClassifier.from_pretrained(folder, dtype=torch.float64, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_labels": 3, "id2label": NAMES},
        {"id2label": {str(i): n for i, n in NAMES.items()}},  # config.json's string keys
        {"label2id": {n: i for i, n in NAMES.items()}},
        {"id2label": NAMES, "label2id": {n: i for i, n in NAMES.items()}},
    ],
    ids=["id2label", "string-keys", "label2id", "both"],
)
def test_from_pretrained_takes_label_names_and_transformers_reads_them_back(
    encoder_folder, tmp_path, kwargs
):
    ours = _new_head(encoder_folder, problem_type="multi_label_classification", **kwargs)
    assert ours.num_labels == 3 and ours.id2label == NAMES
    assert ours.label2id == {"negative": 0, "neutral": 1, "positive": 2}
    saved = ours.save_pretrained(tmp_path / "saved")
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(saved), dtype=torch.float64
    ).eval()
    assert theirs.config.num_labels == 3
    assert theirs.config.id2label == NAMES
    assert theirs.config.label2id == {"negative": 0, "neutral": 1, "positive": 2}
    assert theirs.config.problem_type == "multi_label_classification"
    batch = tiny_batch(token_types=True)
    with torch.no_grad():
        diff = (ours(**batch).logits - theirs(**batch).logits).abs().max()
    assert float(diff) <= 1e-12  # float64: the same model


def test_label_names_that_disagree_or_miss_a_label_are_refused(encoder_folder):
    with pytest.raises(ValueError, match=r"label2id .* is not the inverse of id2label"):
        _new_head(encoder_folder, id2label={0: "a", 1: "b"}, label2id={"a": 1, "b": 0})
    with pytest.raises(ValueError, match=r"id2label must name labels 0\.\.2, got keys \[0, 1\]"):
        _new_head(encoder_folder, num_labels=3, id2label={0: "a", 1: "b"})


@pytest.mark.parametrize(
    ("num_labels", "problem_type", "labels"),
    [
        (3, None, torch.tensor([0, 2, 1, 2])),  # int64 ids: single-label cross-entropy
        (3, None, torch.tensor([0, 2, -100, 2], dtype=torch.int32)),  # int32 too, -100 ignored
        (1, None, torch.tensor([0.5, -1.0, 2.0, 0.0])),  # one label: regression (MSE)
        (3, None, torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]])),  # multi-label
        (3, "regression", torch.randn(4, 3, generator=torch.Generator().manual_seed(2))),
        (3, "single_label_classification", torch.tensor([[2], [0], [1], [1]])),
    ],
    ids=["int64", "int32", "regression", "float-multi", "regression-3", "ids-b1"],
)
def test_forward_with_labels_gives_transformers_loss_and_logits(
    tmp_path, num_labels, problem_type, labels
):
    torch.manual_seed(0)
    config = transformers.BertConfig(**TINY, num_labels=num_labels, problem_type=problem_type)
    theirs = transformers.BertForSequenceClassification(config).double().eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = BertClassifier.from_pretrained(tmp_path / "hf", dtype=torch.float64)
    batch = tiny_batch(token_types=True)
    with torch.no_grad():
        # transformers infers int32 as class ids, then its cross-entropy refuses them; it
        # leaves float labels float32 against float64 logits: both as it would want them
        expected = theirs(**batch, labels=labels.double() if labels.is_floating_point()
                          else labels.long())  # fmt: skip
        out = ours(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   token_type_ids=batch["token_type_ids"], labels=labels)  # fmt: skip
    assert out.loss is not None and out.loss.shape == ()
    assert float((out.loss - expected.loss).abs()) <= 1e-12
    assert float((out.logits - expected.logits).abs().max()) <= 1e-12
    # the problem type is chosen (when None) and kept as transformers keeps it
    assert ours.problem_type == theirs.config.problem_type
    saved = json.loads((ours.save_pretrained(tmp_path / "ours") / "config.json").read_text())
    assert saved["problem_type"] == theirs.config.problem_type


def test_the_output_is_still_the_logits_tensor(tmp_path, encoder_folder):
    """Callers written for `forward` returning logits keep working."""
    model = _new_head(encoder_folder, num_labels=3)
    batch = tiny_batch(token_types=True)
    labels = torch.tensor([0, 1, 2, 1])
    with torch.no_grad():
        plain = model.classifier(model.bert(**batch).pooler_output)  # (B, K)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        with_labels = model(**batch, labels=labels)
    assert isinstance(out, torch.Tensor) and isinstance(out, SequenceClassifierOutput)
    assert out.loss is None and type(out.logits) is torch.Tensor
    assert torch.equal(out, plain) and torch.equal(out.logits, plain)
    assert torch.equal(model.loss(out, labels), with_labels.loss)
    assert type(out.softmax(-1)) is torch.Tensor and type(out + 0) is torch.Tensor
    assert out.argmax(-1).tolist() == plain.argmax(-1).tolist()
    buffer = io.BytesIO()
    torch.save(out, buffer)
    assert type(torch.load(io.BytesIO(buffer.getvalue()))) is torch.Tensor


def test_labels_train_the_model(encoder_folder):
    """`clf(**batch, labels=y).loss.backward()` is a training step; gradients reach the
    encoder and equal those of the separate `loss` call."""
    grads = []
    for together in (True, False):
        model = _new_head(encoder_folder, num_labels=3, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0).train()  # fmt: skip
        batch, labels = tiny_batch(token_types=True), torch.tensor([0, 2, 1, 1])
        loss = (
            model(**batch, labels=labels).loss if together else model.loss(model(**batch), labels)
        )
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0]["bert.embeddings.word.weight"].abs().sum() > 0
    for name, g in grads[0].items():
        assert torch.equal(grads[1][name], g), name


def test_export_gives_a_plain_tensor():
    torch.manual_seed(0)
    model = BertClassifier(BertConfig(**TINY), 3).eval()
    batch = tiny_batch(token_types=True)
    program = torch.export.export(model, (batch["input_ids"], batch["attention_mask"]))
    got = program.module()(batch["input_ids"], batch["attention_mask"])
    assert type(got) is torch.Tensor
    with torch.no_grad():
        assert torch.allclose(got, model(batch["input_ids"], batch["attention_mask"]), atol=1e-6)
    labels = torch.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match="labels: an exported or traced BertClassifier"):
        torch.export.export(model, (batch["input_ids"],), {"labels": labels})
