"""Module rows of `attnkit bench`: a MultiHeadAttention training step (eager and compiled)
against torch.nn.MultiheadAttention, and a recorded forward against torch's need_weights=True.

Legend: B batch, N tokens, C model width, H heads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["module_rows"]

Timer = Callable[[dict[str, Callable[[], None]], int], dict[str, float]]


def _mha_pair(shape, dropout: float, seed: int = 0):
    from attnkit.modules.attention import MultiHeadAttention

    b, n, c, heads = shape
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(c, heads, dropout=dropout, batch_first=True)
    # The same architecture with its own weights: the values do not change the time, and
    # analysis does not import attnkit.convert (imports go one way, DESIGN.md "Layers").
    ours = MultiHeadAttention(c, heads, dropout=dropout)
    x = torch.randn(b, n, c)
    return ours, theirs, x


def module_rows(shape, repeats: int, time_interleaved: Timer) -> list[dict]:
    """Training step with dropout 0.1 (target c), eager and compiled; recorded forward in eval
    (target f). `time_interleaved` is `attnkit.analysis.bench.time_interleaved`."""
    from attnkit.viz.record import record_attention

    ours, theirs, x = _mha_pair(shape, 0.1)
    ours.train(), theirs.train()
    xg = x.clone().requires_grad_(True)

    def train(fn):
        def step():
            ours.zero_grad(set_to_none=True), theirs.zero_grad(set_to_none=True)
            fn().sum().backward()

        return step

    # torch.compile's default (Inductor) backend, compiled before the timing starts
    compiled = torch.compile(ours)
    train(lambda: compiled(xg))()
    steps = {
        "attnkit": train(lambda: ours(xg)),
        "attnkit_compiled": train(lambda: compiled(xg)),
        "torch_need_weights": train(lambda: theirs(xg, xg, xg)[0]),
        "torch_no_weights": train(lambda: theirs(xg, xg, xg, need_weights=False)[0]),
    }
    rows = [{"kind": "module", "what": "train_step_dropout0.1", "shape": list(shape)}]
    rows[0]["ms"] = time_interleaved(steps, repeats)
    ours.eval(), theirs.eval()

    def recorded():
        with torch.no_grad(), record_attention(ours):
            ours(x)

    def torch_weights():
        with torch.no_grad():
            theirs(x, x, x, need_weights=True, average_attn_weights=False)

    ms = time_interleaved(
        {"attnkit_record": recorded, "torch_need_weights": torch_weights}, repeats
    )
    rows.append({"kind": "module", "what": "eval_forward_with_weights", "shape": list(shape)})
    rows[1]["ms"] = ms
    return rows
