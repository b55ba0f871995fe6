"""Task heads on `BertEncoder`: sequence classification (and regression).

Dimensions: B batch, N tokens, C hidden width, K labels (``num_labels``).

`BertClassifier` is transformers' ``BertForSequenceClassification``:
``logits = classifier(dropout(pooler_output))``, its checkpoint names (``bert.*`` for
the encoder, ``classifier.{weight,bias}`` for the head) and its config fields
(``id2label``, ``problem_type``, ``classifier_dropout``), so the folders go both ways.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.models import bert_save
from attnkit.models import checkpoint as ckpt
from attnkit.models.bert import BertConfig, BertEncoder, load_encoder
from attnkit.modules._checks import positive_int

__all__ = ["PROBLEM_TYPES", "BertClassifier", "SequenceClassifierOutput"]

# transformers' config.problem_type values, and the loss each one means
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


class SequenceClassifierOutput(Tensor):
    """What `BertClassifier.forward` returns: the logits (B, K) themselves, with transformers'
    ``.logits`` and ``.loss`` on them.

    It is a tensor so that code written for the logits keeps working (``clf(ids).argmax(-1)``,
    ``torch.equal(clf(a), clf(b))``); ``.logits`` is the same values as a plain tensor;
    ``.loss`` the mean loss when `forward` had ``labels``, else None. Every operation on it
    returns a plain tensor (the loss does not travel along).
    """

    loss: Tensor | None = None
    # operations run as on a plain tensor and return plain tensors
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def logits(self) -> Tensor:
        return self.as_subclass(Tensor)

    @classmethod
    def wrap(cls, logits: Tensor, loss: Tensor | None) -> Tensor:
        """`logits` with `loss` on them; the plain logits inside torch.export / jit.trace
        (exported programs return plain tensors)."""
        if _exporting():
            return logits  # `forward` refused labels already
        out = logits.as_subclass(cls)
        out.loss = loss
        return out

    def __reduce_ex__(self, protocol):
        return self.logits.__reduce_ex__(protocol)  # pickles (torch.save) as the plain logits


def _exporting() -> bool:
    return torch.compiler.is_exporting() or torch.jit.is_tracing()


def _refuse_labels():
    raise ValueError(
        "labels: an exported or traced BertClassifier returns the logits only; "
        "export it without labels and compute clf.loss(logits, labels) outside"
    )


def _label_names(num_labels: int, id2label, label2id) -> dict[int, str]:
    """id -> name from either or both of transformers' ``id2label`` / ``label2id`` (keys may
    be strings, as in config.json); ValueError naming the one at fault unless they name
    exactly 0..K-1 with distinct names and agree."""
    names = source = None
    if id2label is not None:
        names, source = {int(i): str(n) for i, n in id2label.items()}, "id2label"
        if len(set(names.values())) != len(names):
            raise ValueError(f"id2label must give distinct names, got {dict(id2label)}")
    if label2id is not None:
        inverse = {int(i): str(n) for n, i in label2id.items()}
        if len(inverse) != len(label2id):
            raise ValueError(f"label2id must give distinct ids, got {dict(label2id)}")
        if names is not None and inverse != names:
            raise ValueError(f"label2id {dict(label2id)} is not the inverse of id2label "
                             f"{dict(id2label)}")  # fmt: skip
        names, source = inverse, source or "label2id"
    if names is None:
        return {i: f"LABEL_{i}" for i in range(num_labels)}
    if sorted(names) != list(range(num_labels)):
        got = sorted(names)
        raise ValueError(f"{source} must name labels 0..{num_labels - 1}, got keys {got}")
    return dict(sorted(names.items()))


def _regression_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean squared error; labels (B, K), or (B,) when K == 1."""
    b, k = logits.shape
    if tuple(labels.shape) not in ((b, k), (b,) if k == 1 else (b, k)):
        want = f"({b},) or ({b}, 1)" if k == 1 else f"({b}, {k})"
        raise ValueError(f"labels must have shape {want} for regression with logits {(b, k)}, "
                         f"got {tuple(labels.shape)}")  # fmt: skip
    return F.mse_loss(logits.reshape(-1), labels.reshape(-1).to(logits.dtype))


def _single_label_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy over labels (B,) of class ids in [0, K) or -100 (ignored); a batch with
    every label ignored gives 0, not NaN."""
    b, k = logits.shape
    if tuple(labels.shape) not in ((b,), (b, 1)) or labels.is_floating_point():
        raise ValueError(f"labels must be ({b},) class ids (one per batch row), got "
                         f"{tuple(labels.shape)} {labels.dtype}")  # fmt: skip
    labels = labels.reshape(-1).long()
    bad = (labels != -100) & ((labels < 0) | (labels >= k))
    if bool(bad.any()):
        raise ValueError(f"labels must be class ids in [0, {k - 1}] or -100 (ignored), got "
                         f"{labels[bad].unique().tolist()}")  # fmt: skip
    total = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    return total / (labels != -100).sum().clamp(min=1)


def _multi_label_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Binary cross-entropy with logits; labels (B, K) in [0, 1]."""
    b, k = logits.shape
    if labels.shape != logits.shape:
        raise ValueError(f"labels must have the shape of logits {(b, k)} for multi-label, "
                         f"got {tuple(labels.shape)}")  # fmt: skip
    target = labels.to(logits.dtype)
    if not bool(((target >= 0) & (target <= 1)).all()):  # NaN fails both comparisons
        lo, hi = labels.min().item(), labels.max().item()
        raise ValueError(f"labels must lie in [0, 1] for multi-label, got values in "
                         f"[{lo}, {hi}]")  # fmt: skip
    return F.binary_cross_entropy_with_logits(logits, target)


_LOSSES = {
    "regression": _regression_loss,
    "single_label_classification": _single_label_loss,
    "multi_label_classification": _multi_label_loss,
}


class ClassifierHead(nn.Linear):
    """nn.Linear started as transformers starts heads: weight N(0, std^2), bias 0.

    Its own `reset_parameters` keeps that init under `attnkit.reset_parameters`
    (building on `meta`, then `to_empty`)."""

    def __init__(self, in_features: int, out_features: int, std: float, **fk) -> None:
        self.std = std  # before nn.Linear.__init__, which calls reset_parameters
        super().__init__(in_features, out_features, **fk)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, 0.0, self.std)
        nn.init.zeros_(self.bias)


class BertClassifier(nn.Module):
    """BERT encoder + pooler + dropout + linear classifier: ids (B, N) -> logits (B, K).

    `num_labels` K (1 = regression); `problem_type` one of `PROBLEM_TYPES`, or None: the
    first `loss` chooses it from the labels and keeps it, as transformers does (and
    `save_pretrained` writes it). `id2label` / `label2id`: names of the labels (either, or
    both if they agree; default ``LABEL_i``), saved in config.json. Dropout before the classifier is
    ``config.classifier_dropout``, else ``config.hidden_dropout_prob``. The classifier
    starts as transformers' does: weights N(0, initializer_range^2), bias 0.
    """

    def __init__(
        self,
        config: BertConfig,
        num_labels: int = 2,
        *,
        problem_type: str | None = None,
        id2label: dict[int, str] | None = None,
        label2id: dict[str, int] | None = None,
        gradient_checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        positive_int("num_labels", num_labels)
        if problem_type is not None and problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type {problem_type!r} is unknown: wanted {PROBLEM_TYPES}")
        if problem_type == "single_label_classification" and num_labels < 2:
            # softmax over one class is 1 whatever the input: the loss would be exactly 0
            raise ValueError(f"num_labels must be >= 2 for single_label_classification, got "
                             f"{num_labels} (num_labels=1 is regression)")  # fmt: skip
        names = _label_names(num_labels, id2label, label2id)
        fk = {"device": device, "dtype": dtype}
        self.bert = BertEncoder(config, gradient_checkpointing=gradient_checkpointing, **fk)
        p = config.classifier_dropout
        self.drop = nn.Dropout(config.hidden_dropout_prob if p is None else p)
        c, std = config.hidden_size, config.initializer_range
        self.classifier = ClassifierHead(c, num_labels, std, **fk)  # (B, C) -> (B, K)
        self.num_labels = num_labels
        self.problem_type = problem_type
        self.id2label = names

    @property
    def label2id(self) -> dict[str, int]:
        return {n: i for i, n in self.id2label.items()}

    @property
    def config(self) -> BertConfig:
        return self.bert.config

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> SequenceClassifierOutput:
        """Logits (B, K), as a `SequenceClassifierOutput` (a tensor with ``.logits`` and
        ``.loss``); arguments as for `BertEncoder.forward` (mask 1 = real token). With
        `labels`, ``.loss`` is `loss(logits, labels)`. With `document_ids` (a packed batch):
        (D, K), one row per document in the order they start (row by row), each what that
        document gets alone; labels then (D,)."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids,
            position_ids=position_ids, document_ids=document_ids,
        )  # fmt: skip
        logits = self.classifier(self.drop(out.pooler_output))  # (B, K) or (D, K)
        if labels is not None and _exporting():
            _refuse_labels()  # before the loss, whose label checks read data
        loss = None if labels is None else self.loss(logits, labels)
        return SequenceClassifierOutput.wrap(logits, loss)

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """The mean loss of `logits` (B, K) against `labels`, by transformers' rules.

        The problem type is `problem_type`, else (chosen here and kept, as
        transformers' ``BertForSequenceClassification`` does): K == 1 -> regression (mean
        squared error, labels (B,) or (B, 1) floats); int64/int32 labels -> single-label
        classification (cross-entropy, labels B class ids, -100 = ignore; a batch with
        every label ignored gives 0, not NaN); other labels -> multi-label (binary
        cross-entropy with logits, labels (B, K) in [0, 1]).
        """
        logits = logits.as_subclass(Tensor)  # a SequenceClassifierOutput too
        if logits.dim() != 2 or logits.shape[1] != self.num_labels:
            raise ValueError(f"logits must have shape (B, {self.num_labels}), got "
                             f"{tuple(logits.shape)}")  # fmt: skip
        if self.problem_type is None:
            if self.num_labels == 1:
                self.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                self.problem_type = "single_label_classification"
            else:
                self.problem_type = "multi_label_classification"
        return _LOSSES[self.problem_type](logits, labels)

    def resize_token_embeddings(self, num_tokens: int, *, mean_resizing: bool = True) -> None:
        """See `BertEncoder.resize_token_embeddings` (the head does not depend on it)."""
        self.bert.resize_token_embeddings(num_tokens, mean_resizing=mean_resizing)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        num_labels: int | None = None,
        id2label: dict[int, str] | None = None,
        label2id: dict[str, int] | None = None,
        problem_type: str | None = None,
        gradient_checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **overrides,
    ) -> BertClassifier:
        """Load a transformers ``BertForSequenceClassification`` folder, or a ``BertModel``
        folder with a new head (a UserWarning says so: train it before use).

        As transformers' ``AutoModelForSequenceClassification.from_pretrained(folder,
        num_labels=, id2label=, label2id=, problem_type=)``: `num_labels` defaults to the
        checkpoint's (classifier rows, else the labels named, else 2); `id2label` /
        `label2id` (either or both) name the labels, else the config's names are kept when
        they fit; `problem_type` defaults to the config's. `overrides` as for
        `BertEncoder.from_pretrained`. The encoder needs a pooler in the checkpoint.
        Returned in eval mode.
        """
        config_path, weights_path = ckpt.checkpoint_files(directory)
        data = ckpt.read_config_json(config_path)
        config = BertConfig.from_dict(data, str(config_path)).with_overrides(**overrides)
        raw = ckpt.load_weights(weights_path)
        head = raw.get("classifier.weight")
        given = id2label or label2id
        names = {int(i): n for i, n in (data.get("id2label") or {}).items()}
        if num_labels is None:
            named = len(given) if given else len(names)
            num_labels = head.shape[0] if head is not None else (named or 2)
        if not given:  # the config's names, when they fit
            id2label = names if sorted(names) == list(range(num_labels)) else None
        fk = {"device": device, "dtype": dtype}
        model = cls(config, num_labels, problem_type=problem_type or data.get("problem_type"),
                    id2label=id2label, label2id=label2id, **fk)  # fmt: skip
        source = str(weights_path)
        state = ckpt.strip_prefix(raw)
        model.bert = load_encoder(BertEncoder, config, state, source, True, device, dtype)
        model.bert.source_folder = Path(directory)
        model.bert.gradient_checkpointing = bool(gradient_checkpointing)
        if head is None:
            warnings.warn(
                f"{source} has no classifier weights: classifier.weight and .bias start new "
                f"({num_labels} labels); train the model before using its predictions",
                stacklevel=2,
            )
        else:
            c = config.hidden_size
            w = ckpt.take(raw, "classifier.weight", torch.Size((num_labels, c)), source)
            b = ckpt.take(raw, "classifier.bias", torch.Size((num_labels,)), source)
            p = model.classifier.weight
            model.classifier.load_state_dict(
                {"weight": w.to(p.device, p.dtype), "bias": b.to(p.device, p.dtype)}
            )
        return model.eval()

    def save_pretrained(self, directory: str | Path, *, tokenizer=None) -> Path:
        """Write a transformers ``BertForSequenceClassification`` folder (that
        ``AutoModelForSequenceClassification`` and `from_pretrained` load), all or nothing;
        tokenizer files as for `BertEncoder.save_pretrained`. Returns the folder."""
        state = bert_save.hf_state(self.bert, prefix="bert.")
        state["classifier.weight"] = self.classifier.weight.detach().cpu().clone()
        state["classifier.bias"] = self.classifier.bias.detach().cpu().clone()
        dtype = self.classifier.weight.dtype
        config = bert_save.config_dict(self.config, "BertForSequenceClassification", dtype)
        config["id2label"] = {str(i): n for i, n in self.id2label.items()}
        config["label2id"] = self.label2id
        if self.problem_type is not None:
            config["problem_type"] = self.problem_type
        files = bert_save.tokenizer_files(self.bert, tokenizer)
        return bert_save.save_files(directory, state, config, files)
