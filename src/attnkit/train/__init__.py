"""Training: a generic loop (`fit`, checkpoints, DDP), the digits image task, and documents
packed into rows without padding (`pack`)."""

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
from attnkit.train.packing import Packed, pack

__all__ = [
    "Digits",
    "FitResult",
    "Packed",
    "StepResult",
    "TrainConfig",
    "classify_step",
    "distributed",
    "evaluate_classifier",
    "fit",
    "load_digits",
    "pack",
    "random_shift",
]
