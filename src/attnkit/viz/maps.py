"""The data contract between attention capture and the renderers.

Dimensions: L layers, H heads, N queries, S keys, B batch. Capture produces one
tensor per layer of shape (B, H, N, S) (the contract bertviz popularised);
:class:`AttentionMaps` holds one example of it as a single (L, H, N, S) tensor
together with the token strings, validated once so that every renderer can trust it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["AttentionMaps"]

JSON_FORMAT = "attnkit.attention_maps"
JSON_VERSION = 1

# Row sums farther than this from 1 (and from 0, a fully masked row) trigger a warning.
_ROW_SUM_TOL = 1e-2

# Jupyter renderers by class name ("AttentionMaps", "AttentionRecord"). They live in
# attnkit.viz.notebook, above this module, and register here when it is imported: importing
# any attnkit.viz module first runs attnkit/viz/__init__.py, which imports it. So imports
# point one way and every `_repr_html_` finds its renderer.
REPR_HTML: dict[str, Callable[[Any], str | None]] = {}


def _check_tokens(name: str, tokens: Any) -> list[str]:
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise ValueError(f"{name}: expected a list of str, got {type(tokens).__name__}")
    bad = [i for i, t in enumerate(tokens) if not isinstance(t, str)]
    if bad:
        raise ValueError(
            f"{name}: expected a list of str, item {bad[0]} is {type(tokens[bad[0]]).__name__}"
        )
    return list(tokens)


def _normalize_index(name: str, index: int | Sequence[int] | None, size: int) -> list[int]:
    """Turn None / an int / a sequence of ints (negative allowed) into a list of indices."""
    if index is None:
        return list(range(size))
    items = [index] if isinstance(index, int) else list(index)
    if not items:
        raise ValueError(f"{name}: expected at least one index, got an empty sequence")
    out = []
    for i in items:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{name}: expected int indices, got {type(i).__name__}")
        if not -size <= i < size:
            raise ValueError(f"{name}: index {i} out of range for {size} {name}")
        out.append(i % size)
    return out


@dataclass(frozen=True)
class AttentionMaps:
    """Attention probabilities of one example, every layer and head.

    Attributes:
        tokens: the N query tokens.
        maps: float tensor (L, H, N, S); ``maps[l, h, i, j]`` is how much query i
            attends to key j in layer l, head h. Rows sum to 1, or to 0 for a fully
            masked query row.
        key_tokens: the S key tokens (cross-attention); None means ``tokens`` (then S == N).
            After construction it is always a list.
        layer_names: L names for display; None means "layer 0", "layer 1", ...

    Construction validates shapes and values: ValueError for a wrong rank, sizes that
    do not match the tokens, NaN or inf; a warning for rows that sum neither to ~1
    nor to 0 (not probabilities). Prefer :meth:`from_layers` for captured tensors.
    """

    tokens: list[str]
    maps: torch.Tensor
    key_tokens: list[str] | None = None
    layer_names: list[str] | None = None

    def __post_init__(self) -> None:
        tokens = _check_tokens("tokens", self.tokens)
        key_tokens = (
            tokens if self.key_tokens is None else _check_tokens("key_tokens", self.key_tokens)
        )
        maps = self.maps
        if not isinstance(maps, torch.Tensor):
            raise ValueError(f"maps: expected a torch.Tensor, got {type(maps).__name__}")
        if maps.dim() != 4:
            raise ValueError(
                f"maps: expected shape (L, H, N, S), got {tuple(maps.shape)} (rank {maps.dim()})"
            )
        L, H, N, S = maps.shape
        if min(L, H) == 0:
            raise ValueError(f"maps: expected at least one layer and head, got {tuple(maps.shape)}")
        if len(tokens) != N:
            raise ValueError(
                f"maps: got shape {tuple(maps.shape)}, wanted N = len(tokens) = {len(tokens)} "
                f"queries in dim 2"
            )
        if len(key_tokens) != S:
            what = "key_tokens" if self.key_tokens is not None else "tokens (no key_tokens given)"
            raise ValueError(
                f"maps: got shape {tuple(maps.shape)}, wanted S = len({what}) = "
                f"{len(key_tokens)} keys in dim 3"
            )
        names = None
        if self.layer_names is not None:
            names = _check_tokens("layer_names", self.layer_names)
            if len(names) != L:
                raise ValueError(f"layer_names: got {len(names)} names, wanted L = {L}")
        if not maps.is_floating_point():
            maps = maps.float()
        maps = maps.detach().to("cpu", torch.float32).contiguous()
        if not bool(torch.isfinite(maps).all()):
            raise ValueError(f"maps: contains NaN or inf (shape {tuple(maps.shape)})")
        _warn_if_not_probabilities(maps)
        # frozen dataclass: normalise fields once, here.
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "key_tokens", key_tokens)
        object.__setattr__(self, "layer_names", names)
        object.__setattr__(self, "maps", maps)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_layers(
        cls,
        tokens: Sequence[str],
        layers: Sequence[torch.Tensor],
        key_tokens: Sequence[str] | None = None,
        layer_names: Sequence[str] | None = None,
        batch_index: int = 0,
    ) -> AttentionMaps:
        """Build from per-layer tensors, each (B, H, N, S) or (H, N, S).

        ``batch_index`` picks the example from 4-D tensors. Every layer must have
        the same number of heads and the sizes must match ``tokens`` (N) and
        ``key_tokens`` (S, defaults to ``tokens``).
        """
        if isinstance(layers, torch.Tensor) or not isinstance(layers, Sequence):
            raise ValueError(
                f"layers: expected a sequence of per-layer tensors (B, H, N, S) or (H, N, S), "
                f"got {type(layers).__name__}"
            )
        if len(layers) == 0:
            raise ValueError("layers: expected at least one layer tensor, got an empty sequence")
        tokens = _check_tokens("tokens", tokens)
        keys = tokens if key_tokens is None else _check_tokens("key_tokens", key_tokens)
        want = f"(B, H, {len(tokens)}, {len(keys)}) or (H, {len(tokens)}, {len(keys)})"
        picked = []
        for i, t in enumerate(layers):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"layers[{i}]: expected a torch.Tensor, got {type(t).__name__}")
            if t.dim() == 4:
                B = t.shape[0]
                if not -B <= batch_index < B:
                    raise ValueError(
                        f"batch_index: {batch_index} out of range for layers[{i}] of shape "
                        f"{tuple(t.shape)} (batch size {B})"
                    )
                t = t[batch_index]  # (H, N, S)
            elif t.dim() != 3:
                raise ValueError(f"layers[{i}]: got shape {tuple(t.shape)}, wanted {want}")
            if tuple(t.shape[1:]) != (len(tokens), len(keys)):
                raise ValueError(
                    f"layers[{i}]: got (H, N, S) = {tuple(t.shape)}, wanted {want} "
                    f"(N = len(tokens), S = len({'key_tokens' if key_tokens else 'tokens'}))"
                )
            if picked and t.shape[0] != picked[0].shape[0]:
                raise ValueError(
                    f"layers[{i}]: has {t.shape[0]} heads, layers[0] has {picked[0].shape[0]}; "
                    f"all layers need the same number of heads"
                )
            picked.append(t.detach().to("cpu", torch.float32))
        maps = torch.stack(picked)  # (L, H, N, S)
        names = None if layer_names is None else list(layer_names)
        return cls(tokens, maps, None if key_tokens is None else keys, names)

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(L, H, N, S)."""
        return tuple(self.maps.shape)  # type: ignore[return-value]

    @property
    def num_layers(self) -> int:
        return self.maps.shape[0]

    @property
    def num_heads(self) -> int:
        return self.maps.shape[1]

    @property
    def names(self) -> list[str]:
        """Display names of the L layers (``layer_names`` or "layer i")."""
        return self.layer_names or [f"layer {i}" for i in range(self.num_layers)]

    # ------------------------------------------------------------------ transforms
    def select(
        self,
        layers: int | Sequence[int] | None = None,
        heads: int | Sequence[int] | None = None,
    ) -> AttentionMaps:
        """Keep some layers and heads (None keeps all; ints may be negative).

        Returns maps of shape (len(layers), len(heads), N, S); layer names follow the
        layers (unnamed layers are named after their original index, so "layer 3"
        stays "layer 3").
        """
        li = _normalize_index("layers", layers, self.num_layers)
        hi = _normalize_index("heads", heads, self.num_heads)
        maps = self.maps[li][:, hi]  # (L', H', N, S)
        names = [self.names[i] for i in li]
        return AttentionMaps(self.tokens, maps, self.key_tokens, names)

    def mean_over_heads(self) -> AttentionMaps:
        """Average over heads: maps of shape (L, 1, N, S)."""
        return AttentionMaps(
            self.tokens, self.maps.mean(dim=1, keepdim=True), self.key_tokens, self.layer_names
        )

    def _repr_html_(self) -> str | None:
        """Jupyter shows maps as the interactive head view (last layer, mean of heads; at
        most 128 tokens and ~1 MB of data embedded): see `attnkit.viz.show`."""
        render = REPR_HTML.get("AttentionMaps")
        return None if render is None else render(self)

    # ------------------------------------------------------------------ JSON
    def to_json_dict(self, decimals: int = 4) -> dict[str, Any]:
        """A JSON-serialisable dict: tokens, shape and the maps as nested lists (L, H, N, S)
        rounded to ``decimals`` places. Read it back with :meth:`from_json_dict`."""
        if not isinstance(decimals, int) or not 0 <= decimals <= 8:
            raise ValueError(f"decimals: expected an int in [0, 8], got {decimals!r}")
        rounded = torch.round(self.maps.double(), decimals=decimals)
        return {
            "format": JSON_FORMAT,
            "version": JSON_VERSION,
            "shape": list(self.shape),
            "dims": ["layers", "heads", "queries", "keys"],
            "decimals": decimals,
            "tokens": list(self.tokens),
            "key_tokens": list(self.key_tokens or self.tokens),
            "layer_names": None if self.layer_names is None else list(self.layer_names),
            "maps": rounded.tolist(),
        }

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> AttentionMaps:
        """Inverse of :meth:`to_json_dict` (values keep the rounding they were saved with)."""
        if not isinstance(data, dict):
            raise ValueError(f"data: expected a dict, got {type(data).__name__}")
        if data.get("format") != JSON_FORMAT:
            raise ValueError(f"data: expected format {JSON_FORMAT!r}, got {data.get('format')!r}")
        missing = [k for k in ("shape", "tokens", "maps") if k not in data]
        if missing:
            raise ValueError(f"data: missing keys {missing}")
        try:
            maps = torch.tensor(data["maps"], dtype=torch.float32)
        except (TypeError, ValueError) as e:
            raise ValueError(f"data['maps']: not a rectangular nested list of numbers ({e})") from e
        if list(maps.shape) != list(data["shape"]):
            raise ValueError(
                f"data['maps']: got shape {tuple(maps.shape)}, wanted data['shape'] = "
                f"{tuple(data['shape'])}"
            )
        return cls(data["tokens"], maps, data.get("key_tokens"), data.get("layer_names"))


def _warn_if_not_probabilities(maps: torch.Tensor) -> None:
    """Warn when rows of ``maps`` (L, H, N, S) are not probability rows (sum ~1, or 0 if masked)."""
    sums = maps.sum(dim=-1, dtype=torch.float64)  # (L, H, N)
    bad = ((sums - 1).abs() > _ROW_SUM_TOL) & (sums.abs() > _ROW_SUM_TOL)
    negative = bool((maps < 0).any())
    if bool(bad.any()) or negative:
        l, h, n = (int(x) for x in bad.nonzero()[0]) if bool(bad.any()) else (0, 0, 0)
        detail = (
            f"{int(bad.sum())} of {bad.numel()} rows sum to neither ~1 nor 0 "
            f"(e.g. layer {l}, head {h}, query {n}: {float(sums[l, h, n]):.4g})"
            if bool(bad.any())
            else "some weights are negative"
        )
        warnings.warn(
            f"maps: do not look like attention probabilities: {detail}; "
            f"pass softmax outputs, not scores",
            UserWarning,
            stacklevel=4,
        )
