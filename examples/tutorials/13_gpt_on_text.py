# Made from docs/en/tutorials/13-gpt-on-text.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # A small GPT on real text
#
# The other tutorials train on toy tasks: reversing digits, 8×8 images. This one trains a
# language model on real text that every machine running these pages has: the source code of
# Python's own standard library. It takes the steps a real language model takes, at a size that
# trains in seconds on a laptop CPU: a subword tokenizer (byte-level BPE) trained on the corpus,
# attnkit's `GPT`, the cross-entropy of the next token with and without label smoothing, a
# learning rate that warms up and decays, loss curves, and samples.
#
# You will learn:
#
# - how byte-pair encoding builds a vocabulary from a corpus, and what the tokens look like;
# - what label smoothing does to the loss, with numbers you can check by hand;
# - what learning-rate warm-up does to Adam's first steps, measured;
# - how to train attnkit's `GPT` on the tokens and read its loss curves; and why, at this size,
#   neither trick changes much.
#
# ## The corpus: Python's standard library
#
# Six modules of the standard library, read from the folder of the running Python
# (`sysconfig`), in a fixed order. Every Python install has them, so the page needs no
# download; another Python version has slightly other text, and the numbers of this section
# would move a little.

# %%
import math
import sysconfig
from pathlib import Path

import torch

stdlib = Path(sysconfig.get_paths()["stdlib"])
modules = [
    "argparse.py",
    "dataclasses.py",
    "functools.py",
    "textwrap.py",
    "string.py",
    "fractions.py",
]
text = "".join((stdlib / name).read_text(encoding="utf-8") for name in modules)
print(f"{len(modules)} modules, {len(text):,} characters; it starts:")
print(text[:60].replace("\n", "⏎"))

# %% [markdown]
# ```text
# 6 modules, 256,538 characters; it starts:
# # Author: Steven J. Bethard <steven.bethard@gmail.com>.⏎# Ne
# ```
#
# ## A subword tokenizer: byte-level BPE
#
# A character-level model (`attnkit lm train` is one) spends one prediction per character. Byte-pair
# encoding (Sennrich et al. 2016, after Gage 1994) starts from the 256 byte values and repeatedly
# merges the most frequent adjacent pair into a new token, until the vocabulary has the size
# asked for. GPT-2 runs it on bytes (Radford et al. 2019), so any text can be encoded and
# nothing is "unknown". The `tokenizers` library trains one in a second:

# %%
from tokenizers import ByteLevelBPETokenizer

tokenizer = ByteLevelBPETokenizer()
tokenizer.train_from_iterator([text], vocab_size=512, min_frequency=2, show_progress=False)
ids = torch.tensor(tokenizer.encode(text).ids)  # (T,) the whole corpus as token ids
print(f"vocabulary: {tokenizer.get_vocab_size()} tokens (256 bytes + 256 merges)")
print(f"{len(ids):,} tokens: {len(text.encode()) / len(ids):.2f} bytes per token")
print(tokenizer.encode("    def __init__(self, name):").tokens)

# %% [markdown]
# ```text
# vocabulary: 512 tokens (256 bytes + 256 merges)
# 106,721 tokens: 2.40 bytes per token
# ['ĠĠĠ', 'Ġdef', 'Ġ__', 'init', '__(', 'self', ',', 'Ġname', '):']
# ```
#
# `Ġ` is how byte-level BPE shows a space. The frequent pieces of Python became single tokens:
# four spaces of indentation (`ĠĠĠ` + `Ġdef`), `self`, `__(`. With 512 tokens the model predicts
# 2.4 bytes per step instead of one; GPT-2 has 50,257 tokens and about 4 bytes per token on English.
#
# The last 10% of the tokens are held out, to score the model on text it never trained on:

# %%
split = int(len(ids) * 0.9)
train_ids, held_ids = ids[:split], ids[split:]
context = 32  # tokens per training row


def batch(source, starts):
    """Rows of context + 1 tokens: the model reads the first context, predicts the last."""
    return source[starts[:, None] + torch.arange(context + 1)]  # (B, context + 1)


held_batch = batch(held_ids, torch.arange(0, len(held_ids) - context - 1, context + 1)[:64])
print("held-out rows:", tuple(held_batch.shape))

# %% [markdown]
# ```text
# held-out rows: (64, 33)
# ```
#
# ## Label smoothing
#
# The usual loss is the cross-entropy of the true next token, $-\log p_y$. It reaches 0 only when
# $p_y = 1$, so it keeps pushing the logits apart after the model is right. Label smoothing
# (Szegedy et al. 2016; used by the Transformer paper with $\varepsilon = 0.1$) trains against a
# target that puts $1 - \varepsilon$ on the true token and spreads $\varepsilon$ evenly over all $V$:
#
# $$
# L_\varepsilon = -(1 - \varepsilon)\log p_y - \frac{\varepsilon}{V} \sum_{j=1}^{V} \log p_j .
# $$
#
# Its minimum is at $p_y = 1 - \varepsilon + \varepsilon / V$, not at 1, and is not 0: the model is
# told never to be certain. Check it on one prediction over $V = 512$ tokens with
# `torch.nn.functional.cross_entropy(..., label_smoothing=0.1)`, the loss `GPTConfig(label_smoothing=0.1)`
# uses:

# %%
V, eps = 512, 0.1
target = torch.tensor([3])
for p_true in (0.5, 0.9, 1 - eps + eps / V, 0.999):
    probs = torch.full((1, V), (1 - p_true) / (V - 1), dtype=torch.float64)
    probs[0, 3] = p_true
    logits = probs.log()
    plain = torch.nn.functional.cross_entropy(logits, target).item()
    smooth = torch.nn.functional.cross_entropy(logits, target, label_smoothing=eps).item()
    print(f"p(true) = {p_true:.4f}: cross-entropy {plain:.3f}, smoothed {smooth:.3f}")

# %% [markdown]
# ```text
# p(true) = 0.5000: cross-entropy 0.693, smoothed 1.316
# p(true) = 0.9000: cross-entropy 0.105, smoothed 0.947
# p(true) = 0.9002: cross-entropy 0.105, smoothed 0.947
# p(true) = 0.9990: cross-entropy 0.001, smoothed 1.313
# ```
#
# The smoothed loss is lowest near $p = 0.9002$ and rises again as the model grows more certain;
# the plain one keeps falling. Two consequences for the curves below: a smoothed training loss
# cannot be compared with a plain one (it has a floor well above 0), and the model to compare is
# judged by the *plain* cross-entropy on held-out text.
#
# ## Learning-rate warm-up
#
# Adam (Kingma and Ba 2015) divides each gradient by a running estimate of its size. At the first
# step that estimate is the gradient itself, so every weight moves by the full learning rate,
# $\pm\eta$, whatever its gradient: the first updates are as large as they will ever be, taken
# when the model knows nothing. Warm-up starts the learning rate at $\eta / W$ and raises it
# linearly over $W$ steps; nanoGPT's schedule, used here, then decays it along a cosine:
#
# $$
# \eta_t = \eta \cdot \min\Big(1, \frac{t + 1}{W}\Big) \cdot \tfrac12\Big(1 + \cos \frac{\pi t}{T}\Big).
# $$
#
# Measure the first step of `torch.optim.AdamW` on attnkit's `GPT`:

# %%
from attnkit.models import GPT, GPTConfig


def make_model(smoothing=0.0):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=512, n_layer=2, n_head=4, d_model=48, context=context,
                    label_smoothing=smoothing)  # fmt: skip
    return GPT(cfg)


def schedule(warmup, total):
    def factor(t):
        return min(1.0, (t + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * t / total))

    return factor


lr, total = 1e-2, 150
for warmup in (1, 20):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(warmup, total))
    w = model.blocks[0].ff.fn.fc1.weight  # (192, 48): a weight every token's gradient reaches
    before = w.detach().clone()
    g = torch.Generator().manual_seed(0)
    model.loss(
        batch(train_ids, torch.randint(0, split - context - 1, (16,), generator=g))
    ).backward()
    opt.step()
    moved = (w.detach() - before).abs().median().item()
    print(
        f"warm-up over {warmup:2d} steps: median |change| of a weight after step 1 = {moved / lr:.2f} × lr"
    )
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")

# %% [markdown]
# ```text
# warm-up over  1 steps: median |change| of a weight after step 1 = 1.00 × lr
# warm-up over 20 steps: median |change| of a weight after step 1 = 0.05 × lr
# 82,752 parameters
# ```
#
# Without warm-up ($W = 1$) the median weight moves by exactly the learning rate in the first step;
# with $W = 20$, by a twentieth of it. Warm-up was introduced for the original Transformer
# (Vaswani et al. 2017, 4,000 warm-up steps), whose layer normalization comes *after* each residual
# addition (post-LN); Xiong et al. (2020) showed that post-LN's gradients near the output are
# large at initialisation and need it, and that pre-LN, what GPT-2 and attnkit's `GPT` use, trains
# well without it.
#
# ## Training three ways
#
# One function trains a fresh model for 150 steps of 16 random rows and records the training loss
# of every step; the three runs differ in warm-up and label smoothing only (the same
# initialisation, the same batches in the same order):

# %%
batch_size = 16  # rows per step


def train(warmup, smoothing, steps=total):
    model = make_model(smoothing)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(warmup, steps))
    g = torch.Generator().manual_seed(0)  # the same batches in every run
    losses = []
    for _ in range(steps):
        rows = batch(train_ids, torch.randint(0, split - context - 1, (batch_size,), generator=g))
        loss = model.loss(rows)  # with label smoothing when the config has it
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return model.eval(), losses


@torch.no_grad()
def held_out(model):
    """(plain cross-entropy, the model's own training loss) on the held-out rows."""
    logits = model(held_batch[:, :-1])  # (64, context, V)
    plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), held_batch[:, 1:].flatten())
    return plain.item(), model.loss(held_batch).item()


runs = {
    "no warm-up": train(warmup=1, smoothing=0.0),
    "warm-up 20 steps": train(warmup=20, smoothing=0.0),
    "warm-up + label smoothing": train(warmup=20, smoothing=0.1),
}
print(f"a uniform guess over 512 tokens: loss {math.log(512):.2f}")
for name, (model, losses) in runs.items():
    plain, own = held_out(model)
    near = abs(losses[0] - math.log(512)) < 0.3
    print(
        f"{name:26} first loss near 6.24: {near}; held-out cross-entropy below 5.8: {plain < 5.8}"
    )
plain, own = held_out(runs["warm-up + label smoothing"][0])
print("smoothed loss above the plain cross-entropy, same model and rows:", own > plain)

# %% [markdown]
# ```text
# a uniform guess over 512 tokens: loss 6.24
# no warm-up                 first loss near 6.24: True; held-out cross-entropy below 5.8: True
# warm-up 20 steps           first loss near 6.24: True; held-out cross-entropy below 5.8: True
# warm-up + label smoothing  first loss near 6.24: True; held-out cross-entropy below 5.8: True
# smoothed loss above the plain cross-entropy, same model and rows: True
# ```
#
# All three learn: from 6.24, the loss of a uniform guess, to below 5.8 (about 5.4 on the machine
# that wrote this page) on text they never saw. The curves (a running mean over 10 steps) and the learning rates that made them:

# %%
from attnkit.viz.lessons_more import curves_figure


def running_mean(xs, k=10):
    return [
        sum(xs[max(0, i - k + 1) : i + 1]) / len(xs[max(0, i - k + 1) : i + 1])
        for i in range(len(xs))
    ]


steps = range(1, total + 1)
# the legend's name of each run
labels = dict(
    zip(runs, ("no warm-up", "warm-up 20 steps", "warm-up + label smoothing"), strict=True)
)
fig = curves_figure(
    steps,
    {
        "training loss (running mean of 10)": {labels[name]: running_mean(losses) for name, (_, losses) in runs.items()},
        "learning rate": {
            "no warm-up": [lr * schedule(1, total)(t) for t in range(total)],
            "warm-up 20 steps": [lr * schedule(20, total)(t) for t in range(total)],
        },
    },
    xlabel="step", ylabel=["loss (nats per token)", "learning rate"],
    lang="en",
)  # fmt: skip
fig.savefig("13-loss-curves.png", dpi=100)

# %% [markdown]
# ![Left: three training-loss curves falling from about 6.2; the run without warm-up falls first, the warm-up run starts slower and ends beside it, the label-smoothed run lies highest because its loss has a floor. Right: the two learning-rate schedules, one starting at its peak, one rising over 20 steps, both decaying along a cosine](../../assets/tutorials/13-loss-curves.png)
#
# What the curves say, at this size:
#
# - **Warm-up** slows the first steps (the learning rate starts at a twentieth) and brings no
#   clear gain here: the run without it learns faster at first, and the two end close together
#   (which one ends lower changes with the seed and the CPU). A 2-layer pre-LN
#   model with 82,752 parameters is not the model warm-up was invented for (see above); it earns
#   its place in deep models and at large learning rates.
# - **Label smoothing** lifts the training curve: part of that loss is the floor of the smoothed
#   target, not worse predictions. Compare held-out *plain* cross-entropies, as the code above
#   does. Its benefits (calibration, and the BLEU gain the Transformer paper reports) show on
#   models that are confident, which 150 steps do not make.
#
# The numbers of a run depend on the CPU: a float32 sum adds in another order on another machine,
# and 150 steps turn that into another trajectory. So this page prints checks that hold on every
# machine, not losses.
#
# ## Samples
#
# `GPT.generate` continues a prompt one token at a time (temperature 0.8, the 40 most likely tokens).
# Its output differs from machine to machine, so it is not checked:

# %%
model = runs["warm-up 20 steps"][0]
prompt = torch.tensor([tokenizer.encode("    def ").ids])  # (1, P)
g = torch.Generator().manual_seed(0)
out = model.generate(prompt, 60, temperature=0.8, top_k=40, generator=g)
print(tokenizer.decode(out[0].tolist()))

# %% [markdown]
# One run printed:
#
# ```text
#     def
# TI | =   --,
# N--L----====,==   T========
# E#
# E     #==OO |T          '
# ```
#
# After 150 steps the model knows which tokens are frequent (runs of spaces, `=`, `#`, `-`,
# newlines) and almost nothing of how they follow each other: a model this small needs thousands
# of steps before names and calls appear. `attnkit lm train` trains the same model for longer, at
# the character level; see [language models](../guides/language-models.md).
#
# ## Exercises
#
# Each answer is code that runs; try before you open it.
#
# **1.** With label smoothing $\varepsilon$ over $V$ tokens, what probability of the true token
# minimises the loss? Find it numerically for $\varepsilon = 0.1$, $V = 512$.
#
# /// details | Answer
# %%
p_true = torch.linspace(0.5, 0.9999, 100_000, dtype=torch.float64)  # (P,) candidates
rest = (1 - p_true) / (V - 1)  # the other V - 1 tokens share the remainder evenly
loss = -(1 - eps) * p_true.log() - eps / V * (p_true.log() + (V - 1) * rest.log())
best = p_true[loss.argmin()].item()
print(f"best p(true) = {best:.4f}; 1 - eps + eps/V = {1 - eps + eps / V:.4f}")

# %% [markdown]
# ```text
# best p(true) = 0.9002; 1 - eps + eps/V = 0.9002
# ```
# ///
#
# **2.** How many tokens does the BPE tokenizer need for the same text with a vocabulary of 256
# merges fewer, and of 1,536 more? Retrain it with `vocab_size=256` and `vocab_size=2048`.
#
# /// details | Answer
# %%
for size in (256, 2048):
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=size, min_frequency=2, show_progress=False)
    n = len(bpe.encode(text).ids)
    print(f"vocab {size:4d}: {len(text.encode()) / n:.2f} bytes per token")

# %% [markdown]
# ```text
# vocab  256: 1.00 bytes per token
# vocab 2048: 3.89 bytes per token
# ```
#
# 256 tokens are the bytes themselves: no merge, one token per byte. More merges, fewer and
# longer tokens: the model sees more text per step of context, and pays for a larger output layer.
# ///
#
# **3.** The loss at step 1 is close to $\log 512 = 6.24$. Why, for an untrained model?
#
# /// details | Answer
# %%
model = make_model()
with torch.no_grad():
    p = model(held_batch[:, :-1]).softmax(-1)  # (64, context, V)
print(f"largest probability any token gets: {p.max().item():.3f} (uniform: {1 / 512:.3f})")

# %% [markdown]
# ```text
# largest probability any token gets: 0.0... (uniform: 0.002)
# ```
#
# Small initial weights give small logits, so the softmax is close to uniform, and the
# cross-entropy of a uniform guess over $V$ tokens is $\log V$.
# ///
#
# ## Try next
#
# - Train with `steps=2000` (a few minutes) and compare the samples and the curves.
# - Set `lr = 3e-2` or `1e-1`, with and without warm-up; set `n_layer=6`.
# - [The Transformer](06-transformer.md): the encoder-decoder this GPT keeps the decoder of;
#   [Language models](../guides/language-models.md): `attnkit lm`, packing, KV-cached decoding.
# - Sources: Gage, "A New Algorithm for Data Compression" (1994); Sennrich, Haddow, Birch, "Neural
#   Machine Translation of Rare Words with Subword Units" (2016); Radford et al., "Language Models
#   are Unsupervised Multitask Learners" (GPT-2, 2019); Szegedy et al., "Rethinking the Inception
#   Architecture" (label smoothing, 2016); Müller, Kornblith, Hinton, "When Does Label Smoothing
#   Help?" (2019); Kingma and Ba, "Adam" (2015); Xiong et al., "On Layer Normalization in the
#   Transformer Architecture" (2020); Karpathy, nanoGPT.
