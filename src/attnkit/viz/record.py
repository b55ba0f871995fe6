"""Capturing attention probabilities from any model: `record_attention`.

Every `attnkit.modules.Attend` is the named point where probabilities pass.
While recording, each one finds the recording in `attnkit.modules._recording` and hands it
its weights; nothing is set on the model, so outside the `with` block it runs exactly as
before (fast paths back), a deep copy made inside the block is not recorded, and recordings
in two threads, of one model or of two, each get their own maps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnkit.modules._recording import add_sink, sinks
from attnkit.modules.attention import Attend
from attnkit.viz.maps import REPR_HTML, AttentionMaps

__all__ = ["AttentionRecord", "record_attention"]

# Attention that runs outside attnkit's modules (the transformers backend in
# `attnkit.integrations`) joins a recording through this registry and `recording_sink`, so
# that this module imports no other library (imports point from integrations to viz, never
# back). `_EXTERNAL_CLAIMS`: predicates "this model routes its attention through attnkit".
_EXTERNAL_CLAIMS: list[Callable[[nn.Module], bool]] = []


def register_external(claims: Callable[[nn.Module], bool]) -> None:
    """Let `record_attention` accept models for which `claims(model)` is true.

    Their attention function must call `recording_sink(module)` and, when it returns a
    function, compute the probabilities and hand them to it.
    """
    if claims not in _EXTERNAL_CLAIMS:
        _EXTERNAL_CLAIMS.append(claims)


def recording_sink(module: nn.Module) -> Callable[[Tensor], None] | None:
    """Where `module`'s (B, H, N, S) probabilities go if a recording open in this thread
    covers it, else None."""
    found = sinks(module)
    if not found:
        return None

    def sink(weights: Tensor) -> None:
        for each in found:
            each(weights)

    return sink


def _recomputing() -> bool:
    """Whether autograd's backward pass is running this forward call: a gradient-checkpointed
    layer recomputed (`torch.utils.checkpoint`), not a call of the user's. Its maps are the
    forward's again; recording them would list every checkpointed layer twice. The call
    itself still computes the weights, so the recomputation matches the forward it replays."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1


@dataclass
class AttentionRecord:
    """Probabilities captured per attention module, in the order they ran.

    `calls[name]` holds one `(B, H, N, S)` tensor per forward call of the
    module at path `name` (the path of the module that owns the `Attend`,
    e.g. ``"encoder.layers.0.attn"``). A decoder called step by step records
    one entry per step.
    """

    calls: dict[str, list[Tensor]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Module paths, in the order their first call ran."""
        return list(self.calls)

    def __getitem__(self, name: str) -> Tensor:
        """The last map recorded at `name`, (B, H, N, S)."""
        if name not in self.calls:
            raise KeyError(f"no attention recorded at {name!r}; recorded: {self.names}")
        return self.calls[name][-1]

    def add(self, name: str, weights: Tensor, detach: bool) -> None:
        """Append one call's (B, H, N, S) map at `name` (detached if asked); nothing while
        autograd's backward recomputes a checkpointed layer (`_recomputing`)."""
        if not _recomputing():
            self.calls.setdefault(name, []).append(weights.detach() if detach else weights)

    def __len__(self) -> int:
        return len(self.calls)

    def layers(self, prefix: str = "") -> list[Tensor]:
        """The last map of each recorded module whose path starts with `prefix`."""
        return [maps[-1] for name, maps in self.calls.items() if name.startswith(prefix)]

    def stack(self, prefix: str = "") -> Tensor:
        """`layers(prefix)` stacked to (L, B, H, N, S); they must share a shape."""
        maps = self.layers(prefix)
        if not maps:
            raise ValueError(f"no attention recorded under prefix {prefix!r}")
        shapes = {tuple(m.shape) for m in maps}
        if len(shapes) > 1:
            raise ValueError(f"recorded maps differ in shape {sorted(shapes)}; select a prefix")
        return torch.stack(maps)

    def to_maps(
        self,
        tokens: Sequence[str] | None = None,
        *,
        key_tokens: Sequence[str] | None = None,
        prefix: str = "",
        batch_index: int = 0,
    ) -> AttentionMaps:
        """One example as :class:`AttentionMaps` (L, H, N, S), for the renderers.

        The last map of each module under `prefix` becomes a layer (named by its path);
        `batch_index` picks the example from the recorded (B, H, N, S). `tokens` (N) and
        `key_tokens` (S, cross-attention) default to "0", "1", ... ValueError if nothing is
        recorded under `prefix`, if the maps differ in shape (pass a `prefix`, e.g.
        ``"decoder."``) or if the tokens do not match N and S.
        """
        names = [name for name in self.calls if name.startswith(prefix)]
        if not names:
            raise ValueError(
                f"prefix: no attention recorded under {prefix!r}; recorded: {self.names}"
            )
        return _maps_of(self, names, tokens, key_tokens, batch_index)

    def _repr_html_(self) -> str | None:
        """Jupyter shows a recording as the head view of its first example (see
        `attnkit.viz.show`); None (plain repr) when nothing was recorded."""
        render = REPR_HTML.get("AttentionRecord")
        return None if render is None or not self.calls else render(self)


def _maps_of(
    record: AttentionRecord,
    names: list[str],
    tokens: Sequence[str] | None,
    key_tokens: Sequence[str] | None,
    batch_index: int,
) -> AttentionMaps:
    """AttentionMaps from the last call of each module in `names`."""
    layers = [record.calls[name][-1] for name in names]
    shapes = {tuple(m.shape) for m in layers}
    if len(shapes) > 1:
        raise ValueError(
            f"prefix: the maps recorded under it differ in shape {sorted(shapes)}; pass a "
            f"prefix that selects maps of one shape (recorded: {record.names})"
        )
    n, s = layers[0].shape[-2:]
    if isinstance(batch_index, bool) or not isinstance(batch_index, int):
        raise ValueError(f"batch_index: expected an int, got {type(batch_index).__name__}")
    if tokens is None:
        tokens = [str(i) for i in range(n)]
    if key_tokens is None and s != n:
        key_tokens = [str(j) for j in range(s)]
    return AttentionMaps.from_layers(
        tokens, layers, key_tokens=key_tokens, layer_names=names, batch_index=batch_index
    )


def _owner_name(path: str) -> str:
    head, _, last = path.rpartition(".")
    return head if last == "attend" and head else path


@contextlib.contextmanager
def record_attention(model: nn.Module, *, detach: bool = True) -> Iterator[AttentionRecord]:
    """Capture the per-head probabilities of every attnkit attention in `model`.

    >>> with record_attention(model) as rec:
    ...     model(x)
    >>> rec.stack().shape  # (layers, B, H, N, S)

    Probabilities are taken before dropout. With `detach=False` they keep
    their graph (for attention-based losses). A backward pass inside the block records
    nothing: gradient-checkpointed layers run again there, and their maps are the forward's
    (each call is listed once). A Hugging Face model loaded with
    ``attn_implementation="attnkit"`` (see `attnkit.integrations.transformers`) is recorded
    under its own module paths. Raises ValueError if `model` holds no `Attend` module and
    runs on no such backend.

    The recording holds the forward calls made in the thread that opened the block: two
    threads recording one model each get their own maps, and calls from a thread that is
    not recording are neither recorded nor slowed. Recordings of one model may nest or
    overlap (each gets every call); a copy of the model made inside the block
    (`copy.deepcopy`) is another model, not recorded. Nothing is set on the model.
    """
    attends = [(_owner_name(n), m) for n, m in model.named_modules() if isinstance(m, Attend)]
    external = any(claims(model) for claims in _EXTERNAL_CLAIMS)
    if not attends and not external:
        raise ValueError(
            f"record_attention: {type(model).__name__} contains no attnkit attention "
            "(attnkit.modules.Attend) to record"
        )
    record = AttentionRecord()

    def sink_for(name: str):
        return lambda weights: record.add(name, weights, detach)

    # Every other module of an external model is registered too: its attention function
    # reports under the path of the module that calls it.
    others = [(n, m) for n, m in model.named_modules() if external and not isinstance(m, Attend)]
    covered = attends + others
    stops = []
    try:
        for name, module in covered:
            stops.append(add_sink(module, sink_for(name)))
        yield record
    finally:
        for stop in stops:
            stop()
