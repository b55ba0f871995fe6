"""Sequence-to-sequence on synthetic tasks: data, training (Transformer, RNN, Universal
Transformer), alignment pictures."""

from attnkit.seq2seq.alignment import cross_attention, mirror_accuracy, save_alignment_png
from attnkit.seq2seq.kinds import KINDS, make_config, make_model
from attnkit.seq2seq.tasks import BOS, EOS, PAD, TASKS, Task, exact_match, heldout, make_batch
from attnkit.seq2seq.train import (
    TrainConfig,
    build_model,
    evaluate,
    evaluate_by_length,
    load_checkpoint,
    predict,
    train,
)

__all__ = [
    "BOS",
    "EOS",
    "KINDS",
    "PAD",
    "TASKS",
    "Task",
    "TrainConfig",
    "build_model",
    "cross_attention",
    "evaluate",
    "evaluate_by_length",
    "exact_match",
    "heldout",
    "load_checkpoint",
    "make_batch",
    "make_config",
    "make_model",
    "mirror_accuracy",
    "predict",
    "save_alignment_png",
    "train",
]
