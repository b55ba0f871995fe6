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

__all__ = ["PROBLEM_TYPES", "BertClassifier"]

# transformers' config.problem_type values, and the loss each one means
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


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

    `num_labels` K (1 = regression); `problem_type` one of `PROBLEM_TYPES`, or None to
    choose per call of `loss` as transformers does. `id2label`: names of the labels
    (default ``LABEL_i``), saved in config.json. Dropout before the classifier is
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
        gradient_checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        positive_int("num_labels", num_labels)
        if problem_type is not None and problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type {problem_type!r} is unknown: wanted {PROBLEM_TYPES}")
        if id2label is not None and sorted(id2label) != list(range(num_labels)):
            raise ValueError(
                f"id2label must name labels 0..{num_labels - 1}, got keys {sorted(id2label)}"
            )
        fk = {"device": device, "dtype": dtype}
        self.bert = BertEncoder(config, gradient_checkpointing=gradient_checkpointing, **fk)
        p = config.classifier_dropout
        self.drop = nn.Dropout(config.hidden_dropout_prob if p is None else p)
        c, std = config.hidden_size, config.initializer_range
        self.classifier = ClassifierHead(c, num_labels, std, **fk)  # (B, C) -> (B, K)
        self.num_labels = num_labels
        self.problem_type = problem_type
        self.id2label = id2label or {i: f"LABEL_{i}" for i in range(num_labels)}

    @property
    def config(self) -> BertConfig:
        return self.bert.config

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, K); arguments as for `BertEncoder.forward` (mask 1 = real token). With
        `document_ids` (a packed batch): (D, K), one row per document in the order they start
        (row by row), each what that document gets alone; `loss` takes labels (D,)."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids,
            position_ids=position_ids, document_ids=document_ids,
        )  # fmt: skip
        return self.classifier(self.drop(out.pooler_output))  # (B, K) or (D, K)

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """The mean loss of `logits` (B, K) against `labels`, by transformers' rules.

        The problem type is `problem_type`, else: K == 1 -> regression (mean squared
        error, labels (B,) or (B, 1) floats); integer labels -> single-label
        classification (cross-entropy, labels (B,) class ids, -100 = ignore; a batch
        with every label ignored gives 0, not NaN); float labels with K > 1 ->
        multi-label (binary cross-entropy with logits, labels (B, K) in [0, 1]).
        """
        if logits.dim() != 2 or logits.shape[1] != self.num_labels:
            raise ValueError(f"logits must have shape (B, {self.num_labels}), got "
                             f"{tuple(logits.shape)}")  # fmt: skip
        kind = self.problem_type
        if kind is None:
            if self.num_labels == 1:
                kind = "regression"
            elif not labels.is_floating_point():
                kind = "single_label_classification"
            else:
                kind = "multi_label_classification"
        b, k = logits.shape
        if kind == "regression":
            if labels.numel() != b * k:
                raise ValueError(f"labels must have {b * k} values for regression with "
                                 f"logits {(b, k)}, got shape {tuple(labels.shape)}")  # fmt: skip
            return F.mse_loss(logits.reshape(-1), labels.reshape(-1).to(logits.dtype))
        if kind == "single_label_classification":
            if labels.shape != (b,) or labels.is_floating_point():
                raise ValueError(f"labels must be ({b},) class ids, got "
                                 f"{tuple(labels.shape)} {labels.dtype}")  # fmt: skip
            total = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            return total / (labels != -100).sum().clamp(min=1)
        if labels.shape != logits.shape:
            raise ValueError(f"labels must have the shape of logits {(b, k)} for multi-label, "
                             f"got {tuple(labels.shape)}")  # fmt: skip
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))

    def resize_token_embeddings(self, num_tokens: int, *, mean_resizing: bool = True) -> None:
        """See `BertEncoder.resize_token_embeddings` (the head does not depend on it)."""
        self.bert.resize_token_embeddings(num_tokens, mean_resizing=mean_resizing)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        num_labels: int | None = None,
        problem_type: str | None = None,
        gradient_checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **overrides,
    ) -> BertClassifier:
        """Load a transformers ``BertForSequenceClassification`` folder, or a ``BertModel``
        folder with a new head (a UserWarning says so: train it before use).

        `num_labels` defaults to the checkpoint's (classifier rows, else ``id2label``,
        else 2); `problem_type` to the config's. `overrides` as for
        `BertEncoder.from_pretrained`. The encoder needs a pooler in the checkpoint.
        Returned in eval mode.
        """
        config_path, weights_path = ckpt.checkpoint_files(directory)
        data = ckpt.read_config_json(config_path)
        config = BertConfig.from_dict(data, str(config_path)).with_overrides(**overrides)
        raw = ckpt.load_weights(weights_path)
        head = raw.get("classifier.weight")
        names = {int(i): n for i, n in (data.get("id2label") or {}).items()}
        if num_labels is None:
            num_labels = head.shape[0] if head is not None else (len(names) or 2)
        kept_names = names if sorted(names) == list(range(num_labels)) else None
        fk = {"device": device, "dtype": dtype}
        model = cls(config, num_labels, problem_type=problem_type or data.get("problem_type"),
                    id2label=kept_names, **fk)  # fmt: skip
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
        config["label2id"] = {n: i for i, n in self.id2label.items()}
        if self.problem_type is not None:
            config["problem_type"] = self.problem_type
        files = bert_save.tokenizer_files(self.bert, tokenizer)
        return bert_save.save_files(directory, state, config, files)
