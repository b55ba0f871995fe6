"""Parameter-free core: attention, masks, positional encodings."""

from attnkit.functional import masks, positional
from attnkit.functional.attention import BACKENDS, AttentionOutput, attention, use_backend

__all__ = ["BACKENDS", "AttentionOutput", "attention", "masks", "positional", "use_backend"]
