"""Which attention modules are being recorded, and by whom: the registry behind
`attnkit.record_attention` (`attnkit.viz.record`), read by `Attend` and by attention code
outside attnkit's modules (the transformers backend, through `recording_sink`).

Nothing is stored on a module. A recording is a set of entries here, keyed by the id of each
module object it covers, in a `threading.local`:

* a forward call is recorded by the recordings open in the thread that makes it, so two
  threads recording one model (or one recording and another thread just running it) never
  mix their maps, and one ending never switches another off;
* a copy of a module (`copy.deepcopy` inside a recording, a new object with a new id) is not
  covered by the original's recording, during it or after.

A `threading.local` and not a ContextVar: Dynamo traces a thread-local read and guards on it
(a compiled model recorded in one thread stays one graph), where a ContextVar read breaks the
graph (see `attnkit.functional._choose.override`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from torch import Tensor, nn

__all__ = ["Sink", "add_sink", "sinks"]

Sink = Callable[[Tensor], None]
"""Takes one forward call's (B, H, N, S) probabilities."""

_local = threading.local()


def _table() -> dict[int, tuple[Sink, ...]]:
    """This thread's id(module) -> sinks of the recordings open on it, innermost last."""
    table = getattr(_local, "table", None)
    if table is None:
        table = _local.table = {}
    return table


def sinks(module: nn.Module) -> tuple[Sink, ...]:
    """The sinks recording `module` in this thread (empty: not recorded here)."""
    table = getattr(_local, "table", None)
    return table.get(id(module), ()) if table else ()


def add_sink(module: nn.Module, sink: Sink) -> Callable[[], None]:
    """Record `module`'s calls in this thread into `sink`; returns the function that stops it.

    The stop function removes exactly this entry from the table it was added to, so
    recordings may end in any order, and one ended from another thread still ends here.
    The caller keeps `module` alive until then (the key is its id).
    """
    table, key = _table(), id(module)
    table[key] = (*table.get(key, ()), sink)

    def stop() -> None:
        rest = tuple(s for s in table.get(key, ()) if s is not sink)
        if rest:
            table[key] = rest
        else:
            table.pop(key, None)

    return stop
