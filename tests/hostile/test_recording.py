"""Issue 28: `record_attention` is per recording and per thread, and a deep copy made inside a
recording does not inherit it.

Before: recording set `need_weights` and a forward hook on each `Attend`. A deep copy took
both along and recorded into the original's record forever; two recordings of one model (one
thread or two) shared the hooks, so each got the other's maps, and the first to end switched
`need_weights` off under the other, whose hook then failed with "'NoneType' object has no
attribute 'detach'".
"""

from __future__ import annotations

import copy
import threading

import torch
from torch import nn

from attnkit import MultiHeadAttention, record_attention

C, H = 16, 2
NAMES = ["layers.0", "layers.1"]


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([MultiHeadAttention(C, H) for _ in range(2)])

    def forward(self, x):
        """x (B, N, C) -> (B, N, C)."""
        for layer in self.layers:
            x = x + layer(x)
        return x


def model_and_input(n: int = 5):
    torch.manual_seed(0)
    return TwoLayers().eval(), torch.randn(2, n, C)


def calls(rec) -> dict[str, list[int]]:
    """Per module path, the query length N of each recorded (B, H, N, S) map."""
    return {name: [m.shape[2] for m in maps] for name, maps in rec.calls.items()}


def test_a_deep_copy_made_while_recording_is_not_recorded_then_or_later():
    model, x = model_and_input()
    with record_attention(model) as rec:
        twin = copy.deepcopy(model)
        twin(x)
        model(x)
    assert calls(rec) == {name: [5] for name in NAMES}  # the original's call only
    twin(x)  # after the block: still not recorded, and back on the fast path
    assert calls(rec) == {name: [5] for name in NAMES}
    for layer in twin.layers:
        assert not layer.attend._forward_hooks and layer.attend.need_weights is False
        q = torch.randn(1, H, 3, C // H)
        assert layer.attend(q, q, q).weights is None
    with record_attention(model) as again:
        twin(x)
    assert len(again) == 0


def test_two_recordings_of_one_model_each_get_every_call_and_may_end_in_any_order():
    model, x = model_and_input()
    first, second = record_attention(model), record_attention(model)
    rec1, rec2 = first.__enter__(), second.__enter__()
    model(x)
    first.__exit__(None, None, None)  # the outer one ends first
    model(x[:, :3])  # the other is still recording: no "'NoneType' ... 'detach'"
    second.__exit__(None, None, None)
    model(x)
    assert calls(rec1) == {name: [5] for name in NAMES}
    assert calls(rec2) == {name: [5, 3] for name in NAMES}


def test_two_threads_recording_one_model_get_their_own_maps():
    model, _ = model_and_input()
    barrier = threading.Barrier(3, timeout=60)  # two recorders and a thread that only runs
    records, errors = {}, []

    def recorder(n: int, runs_after_the_other_ended: bool) -> None:
        try:
            x = torch.randn(1, n, C)
            with record_attention(model) as rec:
                records[n] = rec
                barrier.wait()  # both recording
                model(x)
                barrier.wait()  # both ran
                if runs_after_the_other_ended:
                    barrier.wait()  # the other thread has left its block
                    model(x)
            if not runs_after_the_other_ended:
                barrier.wait()
        except BaseException as err:  # reported below; a broken barrier frees the others
            errors.append(err)
            barrier.abort()

    def bystander() -> None:
        try:
            barrier.wait()
            model(torch.randn(1, 7, C))  # not recording: in nobody's record
            barrier.wait()
            barrier.wait()
        except BaseException as err:
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=recorder, args=(4, False)),
               threading.Thread(target=recorder, args=(6, True)),
               threading.Thread(target=bystander)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert calls(records[4]) == {name: [4] for name in NAMES}
    assert calls(records[6]) == {name: [6, 6] for name in NAMES}


def test_a_recording_in_one_thread_does_not_see_another_threads_calls():
    model, x = model_and_input()
    with record_attention(model) as rec:
        worker = threading.Thread(target=model, args=(torch.randn(1, 9, C),))
        worker.start()
        worker.join()
        model(x)
    assert calls(rec) == {name: [5] for name in NAMES}
