"""Training: a generic loop (`fit`, checkpoints, DDP) and the digits image task."""

from attnkit.train.data import (
    Digits,
    classify_step,
    evaluate_classifier,
    load_digits,
    random_shift,
)
from attnkit.train.loop import (
    FitResult,
    StepResult,
    TrainConfig,
    distributed,
    fit,
)

__all__ = [
    "Digits",
    "FitResult",
    "StepResult",
    "TrainConfig",
    "classify_step",
    "distributed",
    "evaluate_classifier",
    "fit",
    "load_digits",
    "random_shift",
]
