"""Drop-ins for torch: torch's signatures, state dicts and mask polarity, computed by attnkit.

    from attnkit.nn import MultiheadAttention            # in place of torch.nn.MultiheadAttention
    from attnkit.nn.functional import scaled_dot_product_attention  # in place of torch's SDPA
    from attnkit.nn.attention.flex_attention import flex_attention  # torch.nn.attention's Flex

Nothing else changes in the calling code, checkpoints included; what attnkit adds is its
speed (the backend `auto` picks, e.g. the compiled kernel when dropout is on) and its rule
for a query that may attend to nothing (output 0 and gradient 0, never NaN). Dropout has
torch's statistics from attnkit's own random stream (the same seed drops other positions).
Bad input raises attnkit's message as an instance of ValueError and of the class torch
raises there (RuntimeError, AssertionError), so torch's `except` clauses still catch it.
attnkit's own modules (`attnkit.MultiHeadAttention`: batch first, True = may attend, a
tensor returned) stay as they are; `attnkit.convert.from_torch` turns either module into one
of them (a sequence-first one, `batch_first=False`, only when `batch_first=True`
acknowledges that the copy reads (B, N, C)).
"""

from attnkit.nn import attention, functional
from attnkit.nn.attention.flex_attention import flex_attention
from attnkit.nn.multihead import MultiheadAttention

__all__ = ["MultiheadAttention", "attention", "flex_attention", "functional"]
