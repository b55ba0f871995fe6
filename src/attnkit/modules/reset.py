"""Re-initialise a whole model in place, e.g. after building it on the `meta` device.

    with torch.device("meta"):
        model = attnkit.models.ViT(config)      # no memory, no random numbers
    model.to_empty(device="cpu")                # uninitialised storage
    attnkit.reset_parameters(model)            # every parameter and buffer initialised

It follows torch.nn's convention: every module that owns parameters or computed
buffers has a `reset_parameters()` that initialises its *own* tensors only
(nn.Linear, nn.LayerNorm, ... and attnkit's modules), and this function calls it
on every submodule, parents first.
"""

from __future__ import annotations

from torch import nn

__all__ = ["reset_parameters"]


def reset_parameters(model: nn.Module) -> nn.Module:
    """Call `reset_parameters()` on every submodule of `model` that has one; returns `model`.

    A parameter shared by several modules (a generator tied to an embedding
    table) is initialised once, by the first module that owns it in
    registration order, as at construction; a later owner whose parameters
    were all initialised already is skipped.
    """
    done: set[int] = set()
    for module in model.modules():
        own = [id(p) for p in module.parameters(recurse=False)]
        reset = getattr(module, "reset_parameters", None)
        if callable(reset) and not (own and done.issuperset(own)):
            reset()
        done.update(own)
    return model
