"""The training loop's process-group plumbing: rank and world size, joining the group
under torchrun (`distributed`), rank 0's decision on every rank, and the DDP wrapper.
Without a process group every helper is the single-process identity."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn


def rank_world() -> tuple[int, int]:
    """(rank, world size) of the process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def distributed() -> Iterator[torch.device]:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); yield the device.

    gloo on CPU, nccl on GPU (one GPU per process: cuda:LOCAL_RANK). A plain
    `python` launch yields the single device and does nothing else.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if world == 1 or dist.is_initialized():
        yield device
        return
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield device
        # Leave together: rank 0 evaluates and writes after the last step while the
        # others are done; tearing gloo down under a peer that still runs can abort it.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def agree(flag: bool, device: torch.device | str) -> bool:
    """Rank 0's `flag` on every rank (a broadcast under DDP)."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def wrap_ddp(model: nn.Module, device: torch.device | str, world: int) -> nn.Module:
    """`model` in DistributedDataParallel when `world` > 1 (gradients averaged over ranks)."""
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device] if torch.device(device).type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)  # broadcasts rank 0's weights
