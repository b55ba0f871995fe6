"""Peak bytes of the tensors alive at once inside a block of code: an exact, deterministic
memory measurement (RSS is neither) for benchmarks and memory tests."""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakTensors"]


class PeakTensors(TorchDispatchMode):
    """Peak bytes of tensor storage allocated inside the ``with`` block and alive at once.

    Deterministic, unlike RSS: every op the dispatcher runs (forward, autograd's backward,
    the ring's buffers) reports its outputs; an output whose storage is not one of the op's
    inputs' is a new allocation, counted until its storage is freed. The live total is taken
    after each op, so the peak is exact at op granularity. Not counted: what existed before
    the block (the inputs q, k, v) and scratch memory inside one op (the compiled kernel's
    per-thread block buffers, a few (bq, bk) tiles).
    """

    def __enter__(self):
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {
            t.untyped_storage()._cdata
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        self.live = {c: (w, b) for c, (w, b) in self.live.items() if not w.expired()}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st._cdata not in given and st._cdata not in self.live:
                    self.live[st._cdata] = (StorageWeakRef(st), st.nbytes())
        self.now = sum(b for _, b in self.live.values())
        self.peak = max(self.peak, self.now)
        return out
