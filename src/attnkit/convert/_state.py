"""State-dict plumbing shared by every converter: rename by table, check, load exactly.

A converter describes a peer in two pieces: the peer's parameter names with the
shapes it must have (derived from the attnkit module it fills), and functions
that turn peer tensors into attnkit tensors and back. Everything that can go
wrong with a state dict — a missing key, an unexpected one, a wrong shape — is
reported here, in one `ValueError` that names each key with the shape it got
and the shape it wanted.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

Shape = tuple[int, ...]


def shape_str(shape) -> str:
    dims = [str(int(s)) for s in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def check_state(state: Mapping[str, Tensor], wanted: Mapping[str, Shape], *, source: str) -> None:
    """Raise ValueError unless `state` has exactly the keys of `wanted`, with those shapes."""
    problems = [
        f"missing {k!r} (wanted {shape_str(s)})" for k, s in wanted.items() if k not in state
    ]
    problems += [
        f"{k!r} has shape {shape_str(state[k].shape)}, wanted {shape_str(s)}"
        for k, s in wanted.items()
        if k in state and tuple(state[k].shape) != tuple(s)
    ]
    problems += [f"unexpected {k!r} {shape_str(state[k].shape)}" for k in state if k not in wanted]
    if problems:
        raise ValueError(f"{source}: the state dict does not fit: " + "; ".join(problems))


def rename(state: Mapping[str, Tensor], table: Mapping[str, str]) -> dict[str, Tensor]:
    """`{table[k]: v}` for the keys of `state` (call `check_state` first)."""
    return {table[k]: v for k, v in state.items()}


@torch.no_grad()
def load_exact(module: nn.Module, state: Mapping[str, Tensor], *, source: str) -> nn.Module:
    """Copy `state` into `module` bit for bit (same dtype), after checking keys and shapes."""
    own = module.state_dict()
    check_state(state, {k: tuple(v.shape) for k, v in own.items()}, source=source)
    for k, target in own.items():
        target.copy_(state[k])
    return module


def detached(module: nn.Module) -> dict[str, Tensor]:
    """The module's state dict, detached (copies made later are exact)."""
    return {k: v.detach() for k, v in module.state_dict().items()}


def load_by_table(module: nn.Module, state: dict[str, Tensor], table: dict[str, str], source: str):
    """Copy a peer's state dict into `module` through `table` (peer name -> attnkit name),
    exactly; ValueError naming every missing, unexpected or mis-shaped key."""
    ours = module.state_dict()
    inverse = {v: k for k, v in table.items()}
    unknown = [k for k in ours if k not in inverse]
    if unknown:
        raise ValueError(f"{source}: no peer name for {unknown}")
    wanted = {inverse[k]: tuple(v.shape) for k, v in ours.items()}
    check_state(state, wanted, source=source)
    return load_exact(module, rename(state, table), source=source)
