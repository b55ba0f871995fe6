from __future__ import annotations

import pytest
import torch

from attnkit.models import GPT, CausalLM, GPTConfig, TransformerConfig, generate
from attnkit.models.generate import filter_logits

V = 13


def gpt(context: int = 32, rotary: bool = False) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, n_layer=2, n_head=2, d_model=16, context=context, rotary=rotary)
    return GPT(cfg).eval()


def gpt_rope(context: int = 32) -> GPT:
    return gpt(context, rotary=True)


def causal_lm(max_len: int = 32) -> CausalLM:
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab=V, tgt_vocab=V, d_model=16, num_heads=2, d_ff=32, decoder_layers=2,
        max_len=max_len, norm_first=True, positions="learned", dropout=0.0,
    )  # fmt: skip
    return CausalLM(cfg).eval()


def ids(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def nanogpt_greedy(model, x: torch.Tensor, steps: int, context: int) -> torch.Tensor:
    """nanoGPT's loop: crop to the last `context` tokens, full forward, argmax."""
    for _ in range(steps):
        nxt = model(x[:, -context:])[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        x = torch.cat([x, nxt], 1)
    return x


@pytest.mark.parametrize("make", [gpt, gpt_rope, causal_lm], ids=["gpt", "gpt-rope", "causal-lm"])
def test_greedy_is_the_argmax_of_the_uncached_forward(make):
    m = make()
    x = ids(3, 5)
    got = m.generate(x, 12)
    assert got.shape == (3, 17)
    assert torch.equal(got, nanogpt_greedy(m, x, 12, 32))


@pytest.mark.parametrize("make", [gpt, gpt_rope, causal_lm], ids=["gpt", "gpt-rope", "causal-lm"])
@pytest.mark.parametrize("prompt", [5, 11], ids=["short-prompt", "prompt-over-context"])
def test_text_longer_than_the_context_slides_the_window_like_nanogpt(make, prompt):
    m = make(8)
    x = ids(2, prompt)
    got = m.generate(x, 14)
    assert torch.equal(got, nanogpt_greedy(m, x, 14, 8))


@pytest.mark.parametrize("rotary", [False, True], ids=["learned", "rope"])
def test_left_padded_prompts_get_what_each_prompt_gets_alone(rotary):
    m = gpt(context=10, rotary=rotary)
    a, b, c = ids(1, 6), ids(1, 2, seed=2), ids(1, 4, seed=3)
    pad = 7  # any id: the mask says it is padding
    batch = torch.cat(
        [a, torch.cat([torch.full((1, 4), pad), b], 1), torch.cat([torch.full((1, 2), pad), c], 1)]
    )
    mask = torch.tensor([[1] * 6, [0] * 4 + [1] * 2, [0] * 2 + [1] * 4])
    got = generate(m, batch, 9, attention_mask=mask)  # row 0 outgrows context=10: slides
    for row, (prompt, lead) in enumerate([(a, 0), (b, 4), (c, 2)]):
        alone = m.generate(prompt, 9)
        assert torch.equal(got[row, lead:], alone[0]), row
    assert torch.equal(got[:, :6], batch)  # the padding stays


def test_an_all_ones_mask_is_the_unmasked_run():
    m = gpt()
    x = ids(2, 4)
    assert torch.equal(generate(m, x, 5, attention_mask=torch.ones(2, 4)), m.generate(x, 5))


def test_each_row_stops_at_eos_and_is_padded_with_it():
    m = gpt()
    x = ids(3, 4)
    free = m.generate(x, 10)
    eos = int(free[0, 4 + 2])  # row 0 emits it at step 2 (or earlier)
    got = m.generate(x, 10, eos_id=eos)
    for row in range(3):
        new = free[row, 4:].tolist()
        stop = new.index(eos) if eos in new else len(new)
        assert got[row, 4 : 4 + stop + 1].tolist() == new[: stop + 1]
        assert (got[row, 4 + stop :] == eos).all()
    ended = m.generate(x[:1], 10, eos_id=eos)
    first = free[0, 4:].tolist().index(eos)
    assert ended.shape == (1, 4 + first + 1)  # every row stopped: generation ends early


def test_sampling_is_reproducible_with_a_generator_and_depends_on_it():
    m = gpt()
    x = ids(2, 3)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return m.generate(x, 20, temperature=1.5, generator=g)

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))


def test_sampled_tokens_stay_in_the_top_k_of_the_full_forward():
    m = gpt()
    x = ids(2, 3)
    out = m.generate(x, 15, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = m(out[:, :-1])[:, 2:]  # (B, 15, V): the logits each new token was drawn from
    top = logits.topk(3, dim=-1).indices
    assert (top == out[:, 3:, None]).any(-1).all()
    once = m.generate(x, 15, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(once, m.generate(x, 15))  # top-1 sampling is greedy


def test_filter_logits_top_k_and_top_p_keep_the_smallest_set():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log()
    kept = lambda **kw: torch.isfinite(filter_logits(logits, **kw))[0].tolist()  # noqa: E731
    assert kept(top_k=2) == [False, True, False, True]
    assert kept(top_p=0.8) == [False, True, False, True]  # 0.5 + 0.3 reaches 0.8
    assert kept(top_p=0.81) == [False, True, True, True]
    assert kept(top_p=0.1) == [False, True, False, False]  # the most likely always stays
    assert kept(top_p=1.0) == [True] * 4
    assert kept(top_k=3, top_p=0.6) == [False, True, False, True]


def test_sampled_frequencies_follow_the_filtered_distribution():
    m = gpt()
    x = ids(1, 3).expand(4000, 3)
    g = torch.Generator().manual_seed(0)
    first = generate(m, x, 1, temperature=0.7, top_p=0.9, generator=g)[:, -1]
    with torch.no_grad():
        logits = m(x[:1])[:, -1] / 0.7
    want = filter_logits(logits, top_p=0.9).softmax(-1)[0]
    seen = torch.bincount(first, minlength=V).double() / 4000
    assert (seen[want == 0] == 0).all()
    assert (seen - want.double()).abs().max() < 0.03  # 4000 draws: std <= 0.008


def test_zero_new_tokens_returns_the_prompt():
    x = ids(2, 3)
    assert torch.equal(gpt().generate(x, 0), x)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(temperature=-1.0), "temperature must be a finite number >= 0, got -1.0"),
        (dict(temperature=float("nan")), "temperature must be a finite number"),
        (dict(top_k=0), "top_k must be None or an integer >= 1, got 0"),
        (dict(top_p=0.0), r"top_p must be None or in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), r"top_p must be None or in \(0, 1\], got 1.5"),
        (
            dict(attention_mask=torch.ones(2, 4)),
            r"attention_mask must have the shape of ids \(2, 3\)",
        ),
        (dict(attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]])), "left-padded"),
    ],
)
def test_bad_options_are_value_errors_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        generate(gpt(), ids(2, 3), 4, **kw)


def test_bad_prompts_and_lengths():
    m = gpt()
    with pytest.raises(ValueError, match=r"ids must be integer token ids of shape \(B, P\)"):
        generate(m, torch.randn(1, 3), 2)
    with pytest.raises(ValueError, match="ids must hold at least one token per row"):
        generate(m, torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0, got -1"):
        generate(m, ids(1, 2), -1)
    with pytest.raises(ValueError, match="model must have an integer `context`"):
        generate(torch.nn.Identity(), ids(1, 2), 1)


def test_the_ids_keep_their_integer_dtype():
    from attnkit.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=23, n_layer=1, n_head=2, d_model=16, context=8)).eval()
    ids = torch.tensor([[3, 1, 4]], dtype=torch.int32)
    out = model.generate(ids, 9)  # past the context: the window slides too
    assert out.dtype == torch.int32
    assert torch.equal(out.long(), model.generate(ids.long(), 9))
