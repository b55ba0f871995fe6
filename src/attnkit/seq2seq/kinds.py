"""The model kinds `attnkit seq2seq` trains, sized for a task, and their configs by name.

    transformer  attnkit.models.Transformer (preset `tiny` by default)
    rnn          attnkit.models.rnn.RNNSeq2Seq (GRU/LSTM; no, additive or dot attention)
    universal    attnkit.models.universal.UniversalTransformer (optionally with ACT)

A checkpoint records its kind (``run_info["kind"]``); one without it is a Transformer's
(written before the other kinds existed).
"""

from __future__ import annotations

from torch import nn

from attnkit.models.rnn import RNNConfig, RNNSeq2Seq, rnn_config_from_dict
from attnkit.models.transformer import Transformer, TransformerConfig, config_from_dict, preset
from attnkit.models.universal import (
    UniversalConfig,
    UniversalTransformer,
    universal_config_from_dict,
)
from attnkit.seq2seq.tasks import PAD, Task

__all__ = ["KINDS", "config_from_dict_of", "kind_of", "make_config", "make_model"]

KINDS = ("transformer", "rnn", "universal")
ModelConfig = TransformerConfig | RNNConfig | UniversalConfig

_CLASSES = {
    "transformer": (TransformerConfig, Transformer, config_from_dict),
    "rnn": (RNNConfig, RNNSeq2Seq, rnn_config_from_dict),
    "universal": (UniversalConfig, UniversalTransformer, universal_config_from_dict),
}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"model kind must be one of {KINDS}, got {kind!r}")


def make_config(
    task: Task, kind: str = "transformer", name: str = "tiny", **overrides
) -> ModelConfig:
    """A config of `kind` sized for `task`; `name` is the Transformer preset (tiny, base, big).

    Transformer: shared embeddings and a tied generator, positions covering the task.
    `overrides` are fields of the kind's config (e.g. cell="lstm", attention="dot" for rnn;
    act=True, steps=6 for universal).
    """
    _check_kind(kind)
    size = len(task.vocab)
    longest = max(task.longest_source, task.longest_target)
    if kind == "transformer":
        base = {"share_embeddings": True, "max_len": max(256, longest)}
        return preset(name, src_vocab=size, tgt_vocab=size, pad_id=PAD, **{**base, **overrides})
    if kind == "universal":
        return UniversalConfig(
            vocab=size, pad_id=PAD, **{"max_len": max(256, longest), **overrides}
        )
    return RNNConfig(vocab=size, pad_id=PAD, **overrides)


def make_model(cfg: ModelConfig) -> nn.Module:
    """The model a config describes."""
    for cfg_cls, model_cls, _ in _CLASSES.values():
        if isinstance(cfg, cfg_cls):
            return model_cls(cfg)
    raise ValueError(f"not a seq2seq model config: {type(cfg).__name__}")


def kind_of(model_or_cfg) -> str:
    """ "transformer", "rnn" or "universal" for a model or its config."""
    for kind, (cfg_cls, model_cls, _) in _CLASSES.items():
        if isinstance(model_or_cfg, cfg_cls | model_cls):
            return kind
    raise ValueError(f"not a seq2seq model or config: {type(model_or_cfg).__name__}")


def config_from_dict_of(kind: str, d: dict) -> ModelConfig:
    """Inverse of `cfg.to_dict()` for a config of `kind`."""
    _check_kind(kind)
    return _CLASSES[kind][2](d)
