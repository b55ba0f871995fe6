# Made from docs/en/tutorials/02-multi-head.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Multi-head attention
#
# One attention layer computes one set of weights: each token gets one mixture of
# the others. Multi-head attention runs several attentions side by side, each on its
# own narrow projection of the tokens, and joins their results. This page builds it
# from the shapes up, on the tokens of an image feature map, and shows that four
# formulations you will meet in papers and code are the same computation as
# `attnkit.MultiHeadAttention`.
#
# You will learn:
#
# - why the **channels** are split into heads, never the tokens;
# - the reshapes [B, C, H, W] → [B, HW, C] → [B, h, HW, C/h] and back, with every shape printed
#   and drawn;
# - concatenation of the heads and the output projection $W^O$;
# - the Transformer paper's, BERT's, an einops/`nn.LazyLinear` and Keras's
#   formulations, each checked equal to attnkit with the same weights.
#
# ## One module, four heads
#
# A feature map of 2 images, 64 channels, 6 × 8 positions, and one multi-head
# attention of dimension $C = 64$ with $h = 4$ heads. Each head works in $C/h = 16$ channels.

# %%
import math

import torch

import attnkit

torch.manual_seed(0)
B, C, H, W = 2, 64, 6, 8  # a batch of feature maps, as a CNN gives them
h = 4  # heads
fmap = torch.randn(B, C, H, W)
mha = attnkit.MultiHeadAttention(C, h).eval()
print(mha)

# %% [markdown]
# ```text
# MultiHeadAttention(
#   dim=64, num_heads=4, num_kv_heads=4, head_dim=16, out_dim=64
#   (in_proj): FusedQKV(
#     (qkv): Linear(in_features=64, out_features=192, bias=True)
#   )
#   (attend): Attend(scale=None, dropout=0.0, backend='auto')
#   (proj): Linear(in_features=64, out_features=64, bias=True)
# )
# ```
#
# `in_proj.qkv` is $W^Q$, $W^K$ and $W^V$ stacked into one (3C, C) = (192, 64) matrix, so
# one matrix product gives all three. `proj` is $W^O$. `scale=None` means $1/\sqrt{16}$.
#
# ## From a feature map to tokens and heads, and back
#
# Attention works on a sequence of tokens (B, N, C). A feature map becomes one by
# flattening its H × W positions into N = HW tokens, each token being the C channels
# of one position. Then each of q, k, v (B, N, C) is cut along the channels into $h$
# pieces of $C/h$, and the head axis is moved in front of the tokens, so that each
# head is an independent (N, C/h) attention problem.

# %%
tokens = fmap.flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, C, HW) -> (B, HW, C)
print("tokens:", tuple(tokens.shape))
qkv = mha.in_proj.qkv(tokens)  # (B, HW, 3C)
q, k, v = qkv.split(C, dim=-1)  # (B, HW, C) each
print("q:", tuple(q.shape))
q_heads = q.unflatten(-1, (h, C // h))  # (B, HW, C) -> (B, HW, h, C/h)
print("q split:", tuple(q_heads.shape))
q_heads = q_heads.transpose(1, 2)  # (B, HW, h, C/h) -> (B, h, HW, C/h)
print("q heads:", tuple(q_heads.shape))

merged = q_heads.transpose(1, 2).flatten(2)  # (B, h, HW, C/h) -> (B, HW, h, C/h) -> (B, HW, C)
back = merged.transpose(1, 2).unflatten(2, (H, W))  # (B, HW, C) -> (B, C, HW) -> (B, C, H, W)
print("merged:", tuple(merged.shape), " back:", tuple(back.shape))
print("round trip exact:", torch.equal(merged, q))
print("feature map back:", torch.equal(tokens.transpose(1, 2).unflatten(2, (H, W)), fmap))

# %% [markdown]
# ```text
# tokens: (2, 48, 64)
# q: (2, 48, 64)
# q split: (2, 48, 4, 16)
# q heads: (2, 4, 48, 16)
# merged: (2, 48, 64)  back: (2, 64, 6, 8)
# round trip exact: True
# feature map back: True
# ```
#
# The transpose is what makes it right: `q.view(B, h, HW, C // h)` has the same shape
# but cuts the memory in the wrong order, so each "head" would hold a quarter of
# the tokens with all their channels mixed up (the pitfalls tutorial shows it going wrong).
# `MultiHeadAttention.heads_qkv` and `merge_heads` do exactly these reshapes.
#
# ## Why the channels, and not the tokens
#
# Attention is about pairs of tokens: every query is compared with every key. If the
# tokens were split into $h$ groups, a token in one group could never look at a token
# in another. Splitting the channels keeps every pair: each head sees all 48 tokens,
# through its own 16 of the 64 projected channels, and makes its own 48 × 48 map.

# %%
head = 2
own_rows = mha.in_proj.qkv.weight[head * 16 : (head + 1) * 16]  # W^Q rows of head 2: (16, C)
own_bias = mha.in_proj.qkv.bias[head * 16 : (head + 1) * 16]
print("head 2 sees", q_heads[:, head].shape[1], "tokens of width", q_heads.shape[-1])
own_q = tokens @ own_rows.T + own_bias  # (B, N, 16)
print("head 2 = its own slice of W^Q:", torch.allclose(q_heads[:, head], own_q, atol=1e-6))
y = mha(tokens)  # (B, N, C): the module's answer, the reference for the checks below
print("output as a feature map:", tuple(y.transpose(1, 2).unflatten(2, (H, W)).shape))
with attnkit.record_attention(mha) as rec:
    mha(tokens)
print("maps:", tuple(rec["attend"].shape), "(B, h, N, N): one N × N map per head")

# %% [markdown]
# ```text
# head 2 sees 48 tokens of width 16
# head 2 = its own slice of W^Q: True
# output as a feature map: (2, 64, 6, 8)
# maps: (2, 4, 48, 48) (B, h, N, N): one N × N map per head
# ```
#
# The whole path, drawn for the first image with the module's own numbers: the
# queries (N, C) = (48, 64) with each head's 16 channels in its colour, the four heads'
# queries (N, d) after the split, each head's 48 × 48 attention map, each head's output,
# their concatenation, and the output after $W^O$.

# %%
from attnkit.viz import multi_head_figure

fig = multi_head_figure(mha, tokens, example=0, lang="en")
fig.savefig("02-heads.png", dpi=100)

# %% [markdown]
# ![Multi-head attention of the first image: q split into four heads of 16 channels, each head's 48 × 48 map, the heads' outputs, their concatenation and the output after W^O](../../assets/tutorials/02-heads.png)
#
# The maps of this untrained module are far from sharp: the typical weight is about
# $1/48 \approx 0.02$ and none reaches 0.1. Still, each head has its own pattern, because each
# compares the tokens through its own 16 channels. Trained heads specialise. Here are the 12
# heads of the first layer of a trained model, the all-MiniLM-L6-v2 checkpoint that attnkit
# embeds, on one sentence (tutorial 08 reads them in detail):

# %%
from attnkit.models import BertEncoder, Tokenizer, default_checkpoint
from attnkit.viz import AttentionMaps, layer_view

folder = default_checkpoint()  # all-MiniLM-L6-v2: 6 layers of 12 heads, trained
bert = BertEncoder.from_pretrained(folder).eval()
encoded = Tokenizer.from_pretrained(folder).encode("The cat sat on the mat because it was warm")
with torch.inference_mode(), attnkit.record_attention(bert) as rec:
    bert(**encoded.model_inputs())
trained = AttentionMaps(encoded.tokens[0], rec.stack()[:, 0])  # (L, H, N, N) of one sentence
print("trained maps:", tuple(trained.maps.shape), "(L, H, N, N)")
previous = trained.maps[0].diagonal(offset=-1, dim1=1, dim2=2).mean(-1)  # (H,): weight on i - 1
best = int(previous.argmax())
print(f"layer 0, head {best}: {previous[best]:.2f} of each row on the previous token")
fig = layer_view(trained, 0, title="all-MiniLM-L6-v2, layer 0: 12 trained heads", lang="en")
fig.savefig("02-trained-heads.png", dpi=100)

# %% [markdown]
# ```text
# trained maps: (6, 12, 12, 12) (L, H, N, N)
# layer 0, head 2: 1.00 of each row on the previous token
# ```
#
# ![The 12 heads of the first layer of all-MiniLM-L6-v2 on "The cat sat on the mat because it was warm": one head puts all of each row on the previous token, most put much of it on the class token or the separator](../../assets/tutorials/02-trained-heads.png)
#
# Unlike the untrained maps above, many rows put most of their weight on one or two keys, and
# the heads differ in kind: head 2 reads the previous token, most others park much of their
# weight on `[CLS]` or `[SEP]` and spread the rest over a few words.
#
# More heads do not cost more parameters: $h$ heads of dimension $C/h$ use the same four
# $C \times C$ matrices (and biases) as one head of dimension $C$, $4C^2 + 4C$ parameters.
# What changes is the number of maps.

# %%
for heads in (1, 2, 4, 8):
    m = attnkit.MultiHeadAttention(C, heads)
    n_params = sum(p.numel() for p in m.parameters())
    print(f"h={heads}: head width {m.head_dim:2d}, parameters {n_params}")
print("4·C² + 4·C =", 4 * C * C + 4 * C)

# %% [markdown]
# ```text
# h=1: head width 64, parameters 16640
# h=2: head width 32, parameters 16640
# h=4: head width 16, parameters 16640
# h=8: head width  8, parameters 16640
# 4·C² + 4·C = 16640
# ```
#
# ## The Transformer paper: concatenate, then W^O
#
# Vaswani et al. (2017, §3.2.2) write it head by head:
#
# $$
# \begin{aligned}
# \mathrm{head}_i &= \mathrm{Attention}(QW_i^Q,\ KW_i^K,\ VW_i^V),
#   & W_i^Q, W_i^K, W_i^V &\in \mathbb{R}^{d_{\text{model}} \times d_k} \\
# \mathrm{MultiHead}(Q, K, V) &= \mathrm{Concat}(\mathrm{head}_1, \ldots, \mathrm{head}_h)\,W^O,
#   & W^O &\in \mathbb{R}^{h d_v \times d_{\text{model}}}
# \end{aligned}
# $$
#
# Here is that text as code, with the per-head matrices cut from attnkit's weights:

# %%
Wqkv, bqkv = mha.in_proj.qkv.weight, mha.in_proj.qkv.bias  # (3C, C), (3C,)
d_k = C // h
heads = []
for i in range(h):
    rows = [part * C + i * d_k + j for part in range(3) for j in range(d_k)]
    W_i, b_i = Wqkv[rows].T, bqkv[rows]  # (C, 3·d_k): [W_i^Q | W_i^K | W_i^V]
    q_i, k_i, v_i = (tokens @ W_i + b_i).split(d_k, dim=-1)  # (B, N, d_k) each
    a_i = torch.softmax(q_i @ k_i.transpose(1, 2) / math.sqrt(d_k), dim=-1)  # (B, N, N)
    heads.append(a_i @ v_i)  # (B, N, d_k)
concat = torch.cat(heads, dim=-1)  # (B, N, h·d_k) = (B, N, C)
paper = mha.proj(concat)  # · W^O + b^O
print("each head:", tuple(heads[0].shape), " concat:", tuple(concat.shape))
print("W^O:", tuple(mha.proj.weight.T.shape))
print("equal:", torch.allclose(paper, y, atol=1e-5))

# %% [markdown]
# ```text
# each head: (2, 48, 16)  concat: (2, 48, 64)
# W^O: (64, 64)
# equal: True
# ```
#
# Concatenating the heads is the merge `transpose(1, 2).flatten(2)` above: head $i$
# fills channels $16i$ to $16i + 15$. $W^O$ then mixes the heads' results.
# `attnkit.paper_attention(512, 8, dropout=0.1)` builds the paper's base configuration
# ($d_{\text{model}} = 512$, 8 heads of 64). Its dropout acts on the attention weights, as in the
# tensor2tensor code and the Annotated Transformer; the paper itself applies dropout to
# each sub-layer's output and to the embeddings (§5.4), not to the weights.
#
# ## BERT's formulation
#
# BERT's code (and Hugging Face's `BertSelfAttention`) keeps three separate $C \times C$
# layers and splits heads with `view` + `permute`:

# %%
from torch import nn


class BertStyleSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = hidden_size // num_attention_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)  # BertSelfOutput.dense = W_O

    def transpose_for_scores(self, x):  # (B, N, C) -> (B, h, N, C/h)
        new_shape = (*x.size()[:-1], self.num_attention_heads, self.attention_head_size)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.attention_head_size)
        context = torch.softmax(scores, dim=-1) @ v  # (B, h, N, C/h)
        context = context.permute(0, 2, 1, 3).contiguous()  # (B, N, h, C/h)
        return self.dense(context.view(*context.size()[:-2], -1))  # (B, N, C)


bert = BertStyleSelfAttention(C, h).eval()
with torch.no_grad():  # the same weights: attnkit's fused (3C, C) matrix is [query; key; value]
    layers = (bert.query, bert.key, bert.value)
    for layer, w, b in zip(layers, Wqkv.split(C), bqkv.split(C), strict=True):
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    bert.dense.load_state_dict(mha.proj.state_dict())
print("equal:", torch.allclose(bert(tokens), y, atol=1e-5))

# %% [markdown]
# ```text
# equal: True
# ```
#
# `attnkit.bert_self_attention(768, 12)` is the whole BERT block around this
# (dropout, residual, LayerNorm with eps 1e-12), and `attnkit.models.BertEncoder`
# loads real BERT checkpoints.
#
# ## einops and `nn.LazyLinear`
#
# Many compact implementations write the split as an einops pattern, and some let
# the first call decide the input dimension with `nn.LazyLinear`. The pattern
# `b n (three h d) -> three b h n d` says exactly how the (3C)-wide projection is
# laid out: [q | k | v], and inside each, head after head.

# %%
from einops import rearrange


class EinopsAttention(nn.Module):
    def __init__(self, inner_dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (inner_dim // heads) ** -0.5
        self.to_qkv = nn.LazyLinear(3 * inner_dim)  # input width read at the first call
        self.to_out = nn.Linear(inner_dim, inner_dim)

    def forward(self, x):
        qkv = self.to_qkv(x)  # (B, N, 3·h·d)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.heads)
        attn = torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1)  # (B, h, N, N)
        return self.to_out(rearrange(attn @ v, "b h n d -> b n (h d)"))  # (B, N, C)


ein = EinopsAttention(C, h).eval()
lazy = attnkit.MultiHeadAttention(None, h, out_dim=C).eval()  # dim=None: lazy, like LazyLinear
ein(tokens), lazy(tokens)  # the first call fixes the input width of both
print("lazy module now:", lazy.in_proj.qkv)
with torch.no_grad():
    ein.to_qkv.load_state_dict(mha.in_proj.qkv.state_dict())
    ein.to_out.load_state_dict(mha.proj.state_dict())
    lazy.load_state_dict(mha.state_dict())
print("einops equal:", torch.allclose(ein(tokens), y, atol=1e-5))
print("lazy attnkit equal:", torch.allclose(lazy(tokens), y, atol=1e-5))

# %% [markdown]
# ```text
# lazy module now: Linear(in_features=64, out_features=192, bias=True)
# einops equal: True
# lazy attnkit equal: True
# ```
#
# The layout matches attnkit's, so the weights load unchanged.
#
# ## Keras
#
# Keras's `MultiHeadAttention` keeps the head axis inside its weights: the query
# kernel is (C, h, key_dim), and the output kernel (h, value_dim, C). Note that Keras's
# `key_dim` is the dimension of one head (16 here), not of the keys. `attnkit.convert.to_keras`
# builds a Keras layer with attnkit's weights (and `from_keras` goes the other way). It
# needs Keras 3 (`pip install keras`), here on its torch backend.

# %%
import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # before Keras is imported
import keras

from attnkit.convert import to_keras

layer = to_keras(mha)
print("num_heads:", layer.num_heads, " key_dim:", layer.key_dim)
print("query kernel:", tuple(layer.query_dense.kernel.shape))
print("output kernel:", tuple(layer.output_dense.kernel.shape))
out = layer(tokens.numpy(), tokens.numpy())  # Keras calls layer(query, value)
out = torch.from_numpy(keras.ops.convert_to_numpy(out))
print("equal:", torch.allclose(out, y, atol=1e-5))

# %% [markdown]
# ```text
# num_heads: 4  key_dim: 16
# query kernel: (64, 4, 16)
# output kernel: (4, 16, 64)
# equal: True
# ```
#
# Four ways of writing it, one computation: project to q, k, v; cut the channels into
# heads; attend per head; concatenate; project with $W^O$.
#
# ## Exercises
#
# **1.** Count the parameters of a multi-head attention with $C = 512$ and $h = 8$ heads (the
# Transformer's base model), first by formula, then on the module.
#
# /// details | Answer
# %%
print(f"4·C² + 4·C = {4 * 512 * 512 + 4 * 512:,}")
print(f"module: {sum(p.numel() for p in attnkit.MultiHeadAttention(512, 8).parameters()):,}")

# %% [markdown]
# ```text
# 4·C² + 4·C = 1,050,624
# module: 1,050,624
# ```
#
# The number of heads does not appear: 8 heads of 64 cost what one head of 512 costs.
# ///
#
# **2.** Split `q` into heads the wrong way, as `q.view(B, h, HW, C // h)` would (here `q` is a
# slice of `qkv`, so write `reshape`). Is it equal to the right split? Which tokens and
# channels does the wrong "head 0" hold?
#
# /// details | Answer
# %%
wrong = q.reshape(B, h, H * W, C // h)  # (B, h, 48, 16), the shape of the right split
print("equal to the right split:", torch.equal(wrong, q_heads))
same = torch.equal(wrong[:, 0].flatten(1), q[:, :12].flatten(1))
print("wrong head 0 = tokens 0-11, all 64 channels:", same)
print("right head 0 = all 48 tokens, channels 0-15:", torch.equal(q_heads[:, 0], q[..., :16]))

# %% [markdown]
# ```text
# equal to the right split: False
# wrong head 0 = tokens 0-11, all 64 channels: True
# right head 0 = all 48 tokens, channels 0-15: True
# ```
# ///
#
# **3.** $W^O$ is a sum over heads: $\mathrm{Concat}(\mathrm{head}_1, \ldots)\,W^O =
# \sum_i \mathrm{head}_i W^O_i$, where $W^O_i$ is the block of $W^O$ that reads head $i$'s
# channels. Show it by removing head 2's contribution from the output.
#
# /// details | Answer
# %%
W_O = mha.proj.weight  # (C, C): nn.Linear stores W^O transposed
part = heads[2] @ W_O[:, 32:48].T  # head 2 alone through its 16 columns
zeroed = torch.cat([heads[0], heads[1], torch.zeros_like(heads[2]), heads[3]], dim=-1)
without = mha.proj(zeroed)
print("y - head 2's part == y without head 2:", torch.allclose(y - part, without, atol=1e-5))

# %% [markdown]
# ```text
# y - head 2's part == y without head 2: True
# ```
# ///
#
# **4.** With `num_kv_heads=1` (multi-query attention) the four query heads share one key head
# and one value head of dimension 16. Count the parameters by hand and check.
#
# /// details | Answer
# %%
mqa = attnkit.MultiHeadAttention(C, h, num_kv_heads=1)
by_hand = (C * C + C) + 2 * (C * 16 + 16) + (C * C + C)  # W^Q, W^K and W^V, W^O
print("by hand:", by_hand, " module:", sum(p.numel() for p in mqa.parameters()))

# %% [markdown]
# ```text
# by hand: 10400  module: 10400
# ```
#
# Keys and values now cost a quarter of what they did, and a key/value cache of decoding
# shrinks by the same factor.
# ///
#
# ## Try next
#
# - Change `h` to 1 or 8: the same parameters, a different number of maps.
# - `attnkit.MultiHeadAttention(C, 8, num_kv_heads=2)` shares each key/value head among
#   four query heads (grouped-query attention): fewer parameters, the same output shape.
# - [Masks](04-masks.md), the next tutorial: who may attend to whom.
# - [ViT and T2T-ViT](03-vit-t2t.md) (after the Transformer): an attention whose output has
#   more dimensions than its input.
# - [Self-attention in six steps](01-self-attention.md): one head, by hand.
