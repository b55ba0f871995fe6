"""Seeing the alignment: cross-attention maps of a seq2seq model, scores and heatmaps.

Dimensions: L decoder layers, B batch, H heads, T target (query) positions,
S source (key) positions.

What counts as a "layer": each decoder block of a Transformer; each application of the
shared decoder block of a Universal Transformer (its recurrence steps); the one attention of
an RNN encoder-decoder (H = 1), whose per-step maps are joined along T.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.models.rnn import RNNSeq2Seq
from attnkit.viz.record import record_attention

__all__ = ["cross_attention", "mirror_accuracy", "save_alignment_png", "write_alignments"]


@torch.no_grad()
def cross_attention(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    """Cross-attention probabilities (L, B, H, T, S) of a teacher-forced pass.

    src (B, S) token ids; tgt (B, T) decoder input (BOS y1 ...). Captured with
    `record_attention`, which records one entry per call: one forward gives
    one (B, H, T, S) map per decoder layer (per step of a shared block), and an
    RNN decoder one (B, 1, 1, S) per target step. Raises ValueError for a model
    without cross-attention (an RNN without attention).
    """
    with record_attention(model) as rec:
        model(src, tgt)
    if isinstance(model, RNNSeq2Seq):
        return torch.cat(rec.calls["attention"], dim=2)[None]  # (1, B, 1, T, S)
    maps = [m for name in rec.names if ".cross_attn." in name for m in rec.calls[name]]
    if not maps:
        raise ValueError(f"{type(model).__name__} recorded no cross-attention: {rec.names}")
    return torch.stack(maps)


def mirror_accuracy(maps: Tensor, lengths: Tensor) -> Tensor:
    """Per layer and head (L, H): how often a query's argmax is the mirrored source position.

    maps: (L, B, H, T, S) cross-attention of a reverse task; lengths: (B,)
    number of symbols n of each source. The decoder query t < n predicts
    output symbol t, which is source symbol n - 1 - t; only those queries count.
    """
    if maps.dim() != 5:
        raise ValueError(f"maps must have shape (L, B, H, T, S), got {tuple(maps.shape)}")
    if lengths.shape != (maps.shape[1],):
        raise ValueError(
            f"lengths must have shape (B={maps.shape[1]},), got {tuple(lengths.shape)}"
        )
    t = torch.arange(maps.shape[3], device=maps.device)  # (T,)
    valid = t[None, :] < lengths[:, None]  # (B, T)
    mirrored = lengths[:, None] - 1 - t[None, :]  # (B, T)
    hit = maps.argmax(-1) == mirrored[None, :, None, :]  # (L, B, H, T)
    hit = hit & valid[None, :, None, :]
    return hit.sum((1, 3)).float() / valid.sum().clamp(min=1)  # (L, H)


def save_alignment_png(
    maps: Tensor,
    src_labels: Sequence[str],
    tgt_labels: Sequence[str],
    path: str | Path,
    *,
    title: str = "cross-attention",
    lang: str = "en",
) -> Path:
    """Draw one example's cross-attention (L, H, T, S) as an L × H grid of heatmaps.

    Rows are decoder layers, columns heads; in each heatmap rows are target
    (query) tokens, columns source (key) tokens. Written atomically as PNG. `lang`: the
    labels' language, "en" or "zh" (the title is translated when it is the default).
    """
    from attnkit.viz import AttentionMaps, save_model_view

    if maps.dim() != 4:
        raise ValueError(f"maps must have shape (L, H, T, S), got {tuple(maps.shape)}")
    attn = AttentionMaps(list(tgt_labels), maps.float().cpu(), key_tokens=list(src_labels))
    return save_model_view(attn, path, title=title, lang=lang)


def write_alignments(
    model: nn.Module,
    vocab: Sequence[str],
    src: Tensor,
    pred: Tensor,
    out_dir: str | Path,
    *,
    eos: int,
    bos: int,
    pad: int,
) -> list[Path]:
    """One PNG per row of src (B, S) with its decoded output pred (B, T) (no BOS).

    The decoder input is BOS + the predicted symbols; each heatmap row is
    labelled with the token that query position emits (the last one: EOS).
    """
    paths = []
    for i in range(src.shape[0]):
        src_ids = [t for t in src[i].tolist() if t != pad]
        out_ids = []
        for t in pred[i].tolist():
            if t == eos:
                break
            out_ids.append(t)
        tgt_in = torch.tensor([[bos, *out_ids]], device=src.device)  # (1, T)
        maps = cross_attention(model, src[i : i + 1, : len(src_ids)], tgt_in)[:, 0]  # (L, H, T, S)
        labels = [vocab[t] for t in out_ids] + [vocab[eos]]
        path = Path(out_dir) / f"alignment_{i}.png"
        text = "".join(vocab[t] for t in src_ids if t != eos)
        title = f"cross-attention: {text} -> {''.join(labels[:-1])}"
        paths.append(
            save_alignment_png(maps, [vocab[t] for t in src_ids], labels, path, title=title)
        )
    return paths
