"""Structured masks: masks that describe themselves, so that kernels skip what is masked.

Legend: B batch, H heads, N queries, S keys; bq × bk blocks of the (N, S) score grid.

A `StructuredMask` means exactly what its `.dense()` means — a boolean (B|1, H|1, N, S) tensor,
True = may attend — but never holds one unless asked. Two forms cover what training uses:

* **Row intervals** (`RowIntervals`): query i may attend to keys lo_i <= j < hi_i. Causal,
  sliding windows, prefix-LM, packed documents whose tokens are contiguous, key padding and
  every `&` of them are of this form. A kernel reads two (B|1, N) integer arrays: the key span
  of a query block is [min lo, max hi) of its rows, everything else is skipped without a look.
* **Runs of keys** (`key_runs`): query i may attend the keys of up to `_runs.MAX_RUNS`
  disjoint runs. `|` of row intervals with gaps between them (a local window | a far band, a
  causal window | the first keys) is of this form, and `&` of runs with intervals or runs. A
  kernel computes the stretches of keys a query block's runs cover and masks each row to its
  own runs.
* **Anything else** (`from_function`, documents whose ids are not contiguous, dense tensors,
  `|` with any of those, or of more runs than `MAX_RUNS`): evaluated block by block.
  `block_map` classifies each (query block, key block) as empty, full or partial
  (FlexAttention's `BlockMask` idea, without a compiler); kernels skip empty blocks, mask
  nothing in full ones and read the partial ones' booleans (`kernel_tiles`), so memory stays
  O(partial blocks · bq · bk), never O(N · S).

Positions follow attnkit's one convention: with N != S, query i sits at key position
i + (S - N) (bottom-right alignment, what decoding with a cache needs) for causal, window and
prefix masks alike.
"""

from attnkit.functional._block_scan import EMPTY, FULL, PARTIAL
from attnkit.functional._mask_base import StructuredMask
from attnkit.functional._mask_base import _And as _And  # private names other modules read here
from attnkit.functional._mask_base import _Dense as _Dense
from attnkit.functional._predicates import _Function as _Function
from attnkit.functional._predicates import from_function
from attnkit.functional._row_masks import (
    RowIntervals,
    causal_intervals,
    document,
    document_ids,
    intervals_block,
    prefix,
    window,
)

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "RowIntervals",
    "StructuredMask",
    "causal_intervals",
    "document",
    "document_ids",
    "from_function",
    "intervals_block",
    "prefix",
    "window",
]
