"""The record every cost formula of `attnkit.analysis` returns: `Cost` (matmul MACs per term,
parameters, elementwise FLOPs, masked and skipped MACs, position memory), its algebra (add to
chain layers, multiply to stack them, `_batched` for B inputs sharing one set of weights),
and the positive-integer check of the formulas' sizes. The counting rule is in
`attnkit.analysis.cost`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["ZERO", "Cost"]


def _add_maps(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for name, value in b.items():
        out[name] = out.get(name, 0) + value
    return out


@dataclass(frozen=True)
class Cost:
    """The cost of one forward pass of a layer (or of a stack of layers).

    Add two costs to chain layers; multiply by an integer to stack identical
    layers (parameters and memory scale too: k layers have k sets of weights; the
    position costs take ``layers=`` where the layers share one table).
    """

    # MACs of each matmul term, e.g. {"q_proj": ..., "scores (QKᵀ)": ...}.
    terms: dict[str, int]
    # Trainable parameters; equals sum(p.numel()) of the matching torch modules.
    params: int = 0
    # Non-matmul FLOPs (softmax, scale, mask, bias adds): FLOPs, not MACs.
    elementwise: dict[str, int] = field(default_factory=dict)
    # MACs inside `terms` whose products a mask throws away (the upper triangle
    # under `causal`, keys outside a sliding window). Dense kernels compute them
    # anyway and `macs` includes them; a kernel that skips masked products needs
    # only `unmasked_macs`.
    masked_macs: int = 0
    # MACs inside `terms` that attnkit's compiled chunked kernel never computes under a
    # structured mask (`mha_cost(mask=...)`): whole key blocks it does not visit
    # (`attnkit.analysis.kernel_work`). 0 where no structured mask was given.
    skipped_macs: int = 0
    # Elements (numbers; × the dtype's size for bytes) of the tensors a position scheme holds
    # for a call beyond the parameters: ALiBi's slopes, the compiled kernel's look-up of a
    # relative table, or a dense (1, H, N, S) bias. Shared by the batch (B does not scale it).
    memory: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Own copies: the dataclass is frozen, its maps should not change under it.
        for name in ("terms", "elementwise", "memory"):
            object.__setattr__(self, name, {k: int(v) for k, v in getattr(self, name).items()})

    @property
    def macs(self) -> int:
        """Matmul multiply-accumulates, all terms, as dense kernels compute them."""
        return sum(self.terms.values())

    @property
    def flops(self) -> int:
        """Matmul FLOPs: 2 × `macs` (one multiply and one add per MAC)."""
        return 2 * self.macs

    @property
    def unmasked_macs(self) -> int:
        """MACs of a kernel that skips every masked product (`macs - masked_macs`).

        attnkit's ``chunked`` backend and torch SDPA's CPU flash kernel with
        ``is_causal`` skip whole blocks that are fully masked, so they land
        between this figure and `macs` (closer to this one for long sequences);
        the ``reference`` backend computes every product (`macs`). Under a
        structured mask (`mha_cost(mask=...)`) `computed_macs` is the compiled
        kernel's figure, exactly.
        """
        return self.macs - self.masked_macs

    @property
    def computed_macs(self) -> int:
        """MACs attnkit's compiled chunked kernel computes (`macs - skipped_macs`): between
        `unmasked_macs` and `macs` under a structured mask, since it computes whole blocks."""
        return self.macs - self.skipped_macs

    @property
    def backward_macs(self) -> int:
        """≈ 2 × `macs`: the MACs of the backward pass.

        Each product Y = A·B needs dA = dY·Bᵀ and dB = Aᵀ·dY in backward, each
        as large as the forward product. It is exact when every operand needs a
        gradient; it is less when an input needs none (the pixels of the first
        layer) and more for kernels that recompute Q·Kᵀ in backward instead of
        saving the probabilities (flash kernels: +1 score product, so 2.5× for
        the attention core, as `torch.utils.flop_counter` counts SDPA backward).
        """
        return 2 * self.macs

    @property
    def elementwise_flops(self) -> int:
        """Sum of the non-matmul FLOPs (conventions in `attnkit.analysis.cost`'s docstring)."""
        return sum(self.elementwise.values())

    @property
    def memory_elements(self) -> int:
        """Sum of `memory`: elements held for positions (tables, slopes, a dense bias)."""
        return sum(self.memory.values())

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            terms=_add_maps(self.terms, other.terms),
            params=self.params + other.params,
            elementwise=_add_maps(self.elementwise, other.elementwise),
            masked_macs=self.masked_macs + other.masked_macs,
            skipped_macs=self.skipped_macs + other.skipped_macs,
            memory=_add_maps(self.memory, other.memory),
        )

    def __mul__(self, k: int) -> Cost:
        if isinstance(k, bool) or not isinstance(k, int):
            return NotImplemented
        if k < 0:
            raise ValueError(f"Cost can be stacked a non-negative number of times, got {k}")
        return Cost(
            terms={n: k * v for n, v in self.terms.items()},
            params=k * self.params,
            elementwise={n: k * v for n, v in self.elementwise.items()},
            masked_macs=k * self.masked_macs,
            skipped_macs=k * self.skipped_macs,
            memory={n: k * v for n, v in self.memory.items()},
        )

    __rmul__ = __mul__

    def to_dict(self) -> dict:
        """JSON-friendly summary (all numbers are Python ints)."""
        return {
            "macs": self.macs,
            "flops": self.flops,
            "params": self.params,
            "backward_macs": self.backward_macs,
            "masked_macs": self.masked_macs,
            "unmasked_macs": self.unmasked_macs,
            "skipped_macs": self.skipped_macs,
            "computed_macs": self.computed_macs,
            "elementwise_flops": self.elementwise_flops,
            "terms": dict(self.terms),
            "elementwise": dict(self.elementwise),
            "memory": dict(self.memory),
            "memory_elements": self.memory_elements,
        }


ZERO = Cost(terms={})


def _check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _batched(cost: Cost, batch: int) -> Cost:
    """`cost` for a batch of B inputs: work scales with B, the weights are shared."""
    scaled = batch * cost
    return replace(scaled, params=cost.params, memory=cost.memory)
