"""`GPT`'s cached one-token step without module calls (`attnkit.models.gpt_step.decode_step`)
computes bit for bit what the module path computes, and yields to it whenever a hook, a
recording, training or a replaced module could tell the difference."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import attnkit.models.gpt as gpt_module
from attnkit.models import GPT, GPTConfig, KVCache
from attnkit.models.gpt import GPTBlock
from attnkit.viz.record import record_attention

CONFIGS = {
    "learned": {},
    "rotary": {"rotary": True},
    "sinusoidal": {"positions": "sinusoidal"},
    "gelu_tanh-nobias": {"activation": "gelu_tanh", "bias": False},
    "relu": {"activation": "relu"},
    "silu-dff": {"activation": "silu", "d_ff": 40},
}


def _gpt(dtype=torch.float32, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=23, n_layer=2, n_head=4, d_model=32, context=16, **kw)
    return GPT(cfg, dtype=dtype).eval()


def _decode(model: GPT, ids: torch.Tensor, module_path: bool, monkeypatch=None, grow=False):
    """Prefill ids[:, :4], then one token per step: the logits of every step (B, T - 4, V)
    and the cache; module_path=True turns the module-free step off. grow: a cache without
    capacity (the preallocated one is for inference only)."""
    if module_path:
        monkeypatch.setattr(gpt_module, "decode_step", lambda *a, **k: None)
    cache = KVCache(capacity=None if grow else ids.shape[1])
    model(ids[:, :4], cache=cache)
    steps = [model(ids[:, t : t + 1], cache=cache) for t in range(4, ids.shape[1])]
    if module_path:
        monkeypatch.undo()
    return torch.cat(steps, 1), cache


@pytest.mark.parametrize("batch", [3, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("config", list(CONFIGS), ids=str)
def test_step_is_the_module_path_and_equals_the_full_forward(config, dtype, batch, monkeypatch):
    """Bit for bit the module path's (the same operations in the same order); at batch 1 the
    projections are matrix-vector products (`torch.addmv`), equal up to float rounding."""
    model = _gpt(dtype, **CONFIGS[config])
    ids = torch.randint(0, 23, (batch, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fast, fast_cache = _decode(model, ids, False)
        slow, slow_cache = _decode(model, ids, True, monkeypatch)
        full = model(ids)[:, 4:]
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    same = torch.equal if batch > 1 else partial(torch.allclose, atol=tol / 10, rtol=0)
    assert same(fast, slow)
    assert fast_cache.length == slow_cache.length == 12
    for m, (k, v) in fast_cache.entries.items():
        assert same(k, slow_cache.entries[m][0]) and same(v, slow_cache.entries[m][1])
    torch.testing.assert_close(fast, full, atol=tol, rtol=0)


def test_step_is_taken_in_eval_and_not_in_training(monkeypatch):
    """With GPTBlock.forward broken, only the module-free step can decode."""
    model = _gpt()
    ids = torch.randint(0, 23, (2, 6))
    cache = KVCache()
    with torch.no_grad():
        model(ids[:, :5], cache=cache)

        def broken(*a, **k):
            raise AssertionError("module path")

        monkeypatch.setattr(GPTBlock, "forward", broken)
        model(ids[:, 5:], cache=cache)  # eval: no block is called
        model.train()
        with pytest.raises(AssertionError, match="module path"):
            model(ids[:, 5:], cache=cache)


def test_a_submodule_in_training_mode_applies_its_dropout(monkeypatch):
    model = _gpt(dropout=0.5)
    model.blocks[1].ff.train()  # only this residual's dropout is in force
    ids = torch.randint(0, 23, (2, 7))
    with torch.no_grad():
        torch.manual_seed(3)
        fast, _ = _decode(model, ids, False)
        torch.manual_seed(3)
        slow, _ = _decode(model, ids, True, monkeypatch)
        model.blocks[1].ff.eval()
        plain, _ = _decode(model, ids, False)
    assert torch.equal(fast, slow) and not torch.allclose(fast, plain)


@pytest.mark.parametrize("batch", [2, 1])
def test_gradients_through_the_step_equal_the_module_path(batch, monkeypatch):
    model = _gpt(torch.float64)
    ids = torch.randint(0, 23, (batch, 7))

    def grads(module_path: bool):
        model.zero_grad()
        logits, _ = _decode(model, ids, module_path, monkeypatch, grow=True)
        logits.square().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    fast, slow = grads(False), grads(True)
    for name in fast:
        torch.testing.assert_close(fast[name], slow[name], atol=1e-12, rtol=0, msg=name)


def _first_block(model: GPT):
    block = model.blocks[0]
    return block, block.attn.fn, block.ff.fn


def test_hooks_anywhere_are_honoured():
    model = _gpt()
    ids = torch.randint(0, 23, (1, 6))
    block, mha, ff = _first_block(model)
    watched = [
        block,
        block.attn,
        block.ff.norm,
        mha,
        mha.in_proj.qkv,
        mha.proj,
        mha.attend,
        ff.fc1,
        ff.act,
        model.norm,
        model.head,
        model.tokens,
    ]
    for module in watched:
        calls = []
        handle = module.register_forward_hook(lambda *a, calls=calls: calls.append(1))
        cache = KVCache()
        with torch.no_grad():
            model(ids[:, :5], cache=cache)
            calls.clear()
            model(ids[:, 5:], cache=cache)
        handle.remove()
        assert calls == [1], type(module).__name__
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(m))
    try:
        cache = KVCache()
        with torch.no_grad():
            model(ids[:, :5], cache=cache)
            seen.clear()
            model(ids[:, 5:], cache=cache)
    finally:
        handle.remove()
    assert ff.fc2 in seen  # a global hook sees every module of the step


def test_recording_sees_every_step():
    model = _gpt()
    ids = torch.randint(0, 23, (1, 7))
    cache = KVCache()
    with torch.no_grad(), record_attention(model) as rec:
        model(ids[:, :5], cache=cache)
        model(ids[:, 5:6], cache=cache)
        model(ids[:, 6:], cache=cache)
    assert len(rec.calls) == 2  # both layers
    for maps in rec.calls.values():  # the prompt, then the two one-token steps
        assert [tuple(w.shape) for w in maps] == [(1, 4, 5, 5), (1, 4, 1, 6), (1, 4, 1, 7)]


class _Doubled(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


class _Half(nn.Module):
    def forward(self, w):
        return 0.5 * w


def _replace_fc1(model: GPT) -> None:
    old = model.blocks[1].ff.fn.fc1
    new = _Doubled(old.in_features, old.out_features, dtype=old.weight.dtype)
    new.load_state_dict(old.state_dict())
    model.blocks[1].ff.fn.fc1 = new


@pytest.mark.parametrize(
    "change",
    [
        _replace_fc1,
        lambda m: parametrize.register_parametrization(m.blocks[0].attn.fn.proj, "weight", _Half()),
        lambda m: setattr(m.blocks[0].ff.fn, "act", nn.Tanh()),
        lambda m: setattr(m.blocks[1].attn, "norm", nn.RMSNorm(32, dtype=torch.float64)),
    ],
    ids=["linear-subclass", "parametrization", "other-activation", "other-norm"],
)
def test_replaced_modules_run_as_written(change, monkeypatch):
    """A changed model decodes what its uncached forward computes (the modules' own forward)."""
    model = _gpt(torch.float64)
    change(model)
    ids = torch.randint(0, 23, (2, 9))
    with torch.no_grad():
        fast, _ = _decode(model, ids, False)
        full = model(ids)[:, 4:]
    torch.testing.assert_close(fast, full, atol=1e-12, rtol=0)


def test_positions_past_the_table_still_raise_the_module_error():
    model = _gpt()
    cache = KVCache()
    with torch.no_grad():
        model(torch.zeros(1, 16, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="max_len"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


# --------------------------------------------------------------------------- the kept plan


def _count_plans(monkeypatch) -> list:
    import attnkit.models.gpt_step as step

    made, real = [], step._plan
    monkeypatch.setattr(step, "_plan", lambda *a: made.append(1) or real(*a))
    return made


def test_generate_checks_the_model_once_per_cache_and_decodes_the_same(monkeypatch):
    """Nothing but `generate` runs between its steps, so the plan of the first step is kept
    for the 13 one-token steps that fill the first cache (context 16, prompt 3); past the
    context every token re-encodes the window (a many-token forward: no plan)."""
    model = _gpt()
    ids = torch.randint(0, 23, (2, 3), generator=torch.Generator().manual_seed(4))
    made = _count_plans(monkeypatch)
    out = model.generate(ids, 30)  # context 16: the window slides
    plans = len(made)
    monkeypatch.setattr(gpt_module, "decode_step", lambda *a, **k: None)
    assert torch.equal(out, model.generate(ids, 30))  # the module path's tokens
    assert plans == 1


def test_a_cache_used_by_hand_checks_the_model_at_every_step(monkeypatch):
    model = _gpt()
    made = _count_plans(monkeypatch)
    cache = KVCache(capacity=16)
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        for _ in range(3):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        calls = []
        model.head.register_forward_hook(lambda *a: calls.append(1))  # between two steps
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    assert len(made) == 4 and calls == [1]


def test_a_hook_on_the_model_runs_between_steps_so_nothing_is_kept(monkeypatch):
    """A pre-hook on the GPT is code run at every step of `generate`: here it starts watching
    a projection at the third step, and that projection's hook must see every later step."""
    model = _gpt()
    calls, steps = [], []
    proj = model.blocks[1].attn.fn.proj

    def pre_hook(module, args, kwargs):
        steps.append(1)
        if len(steps) == 3:
            proj.register_forward_hook(lambda *a: calls.append(1))

    model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    model.generate(torch.zeros(1, 2, dtype=torch.long), 8)
    assert len(steps) == 8 and len(calls) == 6  # steps 3 .. 8 (the prompt is step 1)
