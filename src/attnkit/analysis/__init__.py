"""Cost analysis: exact MAC / FLOP / parameter / memory counts of attention.

FLOPs = 2 × MACs for every matmul term; elementwise work (softmax, scale, mask,
bias adds) is counted apart as FLOPs. See `attnkit.analysis.cost`.
"""

from attnkit.analysis.cost import Cost, allowed_pairs, mha_cost, single_head_cost
from attnkit.analysis.heads import HeadStats, grid_positions, head_stats, token_positions
from attnkit.analysis.kernel_work import KernelWork, kernel_work
from attnkit.analysis.memory import Memory, attention_memory, score_matrix_bytes
from attnkit.analysis.models_cost import ModelCost, bert_cost, transformer_cost, vit_cost
from attnkit.analysis.positions_cost import (
    alibi_cost,
    relative_bias_cost,
    rotary_cost,
    softcap_cost,
)
from attnkit.analysis.window_cost import swin_window_cost

__all__ = [
    "Cost",
    "HeadStats",
    "KernelWork",
    "Memory",
    "ModelCost",
    "alibi_cost",
    "allowed_pairs",
    "attention_memory",
    "bert_cost",
    "grid_positions",
    "head_stats",
    "kernel_work",
    "mha_cost",
    "relative_bias_cost",
    "rotary_cost",
    "score_matrix_bytes",
    "single_head_cost",
    "softcap_cost",
    "swin_window_cost",
    "token_positions",
    "transformer_cost",
    "vit_cost",
]
