"""`attnkit flops` for one attention layer: multi-head (self, cross, GQA, masked) or Swin
windows; the formula's count, checked against an independent closed form, and its report."""

from __future__ import annotations

import argparse
import math

from attnkit.cli._flops_format import elementwise_line, format_bytes, term_table
from attnkit.cli.flops_mask import mask_lines, mask_tokens, mask_work

# options of one multi-head attention layer that --window (Swin) does not take
MHA_ONLY = ("context", "context_dim", "key_dim", "value_dim", "kv_heads", "head_dim",
            "v_head_dim", "out_dim")  # fmt: skip


def _parse_grid(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--grid must look like HxW with positive integers (56x56), got {text!r}")
    return int(parts[0]), int(parts[1])


def layer_report(args: argparse.Namespace) -> dict:
    """{"text", "json", "what"} of one layer: its terms, closed form, memory and mask."""
    from attnkit.analysis import attention_memory, mha_cost, score_matrix_bytes, swin_window_cost

    if args.dim is None or args.heads is None:
        raise ValueError("--dim and --heads are required (or --model)")
    if args.window is not None and args.grid is None:
        raise ValueError("--window needs --grid HxW (Swin windows of M×M patches on a grid)")
    if args.shifted and args.window is None:
        raise ValueError("--shifted needs --window and --grid")
    n = args.tokens
    if args.grid is not None:
        gh, gw = _parse_grid(args.grid)
        if n is not None and n != gh * gw:
            raise ValueError(f"--tokens {n} disagrees with --grid {args.grid} ({gh * gw} tokens)")
        n = gh * gw
    n = mask_tokens(args.mask or [], n)
    if n is None:
        raise ValueError("--tokens N is required (or --grid HxW)")
    if args.head_dim is None and args.dim % args.heads:
        raise ValueError(f"--heads {args.heads} must divide --dim {args.dim} (or give --head-dim)")
    if args.kv_heads is not None and args.heads % args.kv_heads:
        raise ValueError(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")

    d = args.head_dim or args.dim // args.heads
    dv = args.v_head_dim or d
    if not args.out_proj and args.out_dim is not None and args.out_dim != args.heads * dv:
        raise ValueError(
            f"--out-dim {args.out_dim} must equal H·DV = {args.heads * dv} with --no-out-proj "
            "(the output is the merged heads); drop --out-dim"
        )

    work = None  # --mask: the mask and what the kernel computes under it
    if args.window is not None:
        unsupported = any(getattr(args, f) is not None for f in MHA_ONLY)
        if unsupported or args.causal or args.mask or not args.out_proj:
            raise ValueError(
                "--window (Swin) takes only --dim, --heads, --grid, --shifted, --batch"
            )
        cost = swin_window_cost(
            gh, gw, args.dim, args.heads, args.window, args.shifted, batch=args.batch
        )
        m = min(args.window, gh, gw)
        hp, wp = math.ceil(gh / m) * m, math.ceil(gw / m) * m
        form = "4h'w'C² + 2M²h'w'C" if (hp, wp) != (gh, gw) else "4hwC² + 2M²hwC"
        value = 4 * hp * wp * args.dim**2 + 2 * m * m * hp * wp * args.dim
        closed = f"{form} = 4·{hp}·{wp}·{args.dim}² + 2·{m}²·{hp}·{wp}·{args.dim}"
        title = f"Swin {'SW' if args.shifted else 'W'}-MSA  grid {gh}x{gw}  M={m}  C={args.dim}"
        title += f"  H={args.heads}"
        s, score_heads, score_n = m * m, args.heads, (hp // m) * (wp // m) * m * m
    else:
        work = mask_work(args, n) if args.mask else None
        cost = mha_cost(
            n, args.dim, args.heads, context_len=args.context, context_dim=args.context_dim,
            key_dim=args.key_dim, value_dim=args.value_dim, kv_heads=args.kv_heads,
            head_dim=args.head_dim, v_head_dim=args.v_head_dim, out_dim=args.out_dim,
            out_proj=args.out_proj, causal=args.causal, batch=args.batch,
            mask=work and work["mask"],
        )  # fmt: skip
        closed, value = _mha_closed_form(args, n)
        s, score_heads, score_n = args.context or n, args.heads, n
        cross = ("context", "context_dim", "key_dim", "value_dim")
        kind = "cross" if any(getattr(args, f) is not None for f in cross) else "self"
        title = f"multi-head {kind}-attention  N={n}  S={s}  C={args.dim}  H={args.heads}"
        title += "" if args.out_proj else "  no W_O"
    value *= args.batch
    if args.batch > 1:
        closed = f"B·({closed})"
    if value != cost.macs:  # the closed form is an independent check of the formula
        raise RuntimeError(f"closed form {value} != formula {cost.macs}: a bug in attnkit")
    scores = score_matrix_bytes(args.batch, score_heads, score_n, s)
    mem = attention_memory(args.batch, score_heads, score_n, s, d, kv_heads=args.kv_heads, v_dim=dv)
    lines = [f"{title}  B={args.batch}", "", *term_table(cost), ""]
    lines.append(f"closed form: {closed} = {value:,} MACs")
    lines.append(f"params: {cost.params:,}")
    lines.append(f"backward ≈ 2 × forward: {cost.backward_macs:,} MACs")
    if cost.masked_macs:
        lines.append(
            f"masked products: {cost.masked_macs:,} MACs; a kernel that skips them needs "
            f"{cost.unmasked_macs:,} (dense kernels compute all {cost.macs:,})"
        )
    if work:
        lines += mask_lines(work["summary"], cost, n, args, textbook=textbook(args))
    lines.append(f"score matrix (B·H·N·S, float32): {format_bytes(scores)}")
    lines.append(f"kept for backward (reference backend): {format_bytes(mem.saved_bytes)}")
    lines.append(elementwise_line(cost))
    if args.window is not None:
        dense = swin_window_cost(gh, gw, args.dim, args.heads, args.window, dense=True)
        lines.append(
            f"relative position bias: the score function holds {cost.memory_elements:,} numbers "
            f"(a dense (H, M², M²) bias: {dense.memory_elements:,})"
        )
    data = {**cost.to_dict(), "closed_form": closed, "score_matrix_bytes": scores}
    if work:
        data["score_entries"] = work["summary"]
    data["memory_reference"] = mem.to_dict()
    what = f"{kind}-attention layer" if args.window is None else "Swin window attention"
    return {"text": "\n".join(lines), "json": data, "what": what}


def textbook(args: argparse.Namespace) -> bool:
    """Self-attention with H·d = C and d_v = d: 4NC² + 2N²C (3NC² + 2N²C without W_O)."""
    c, h = args.dim, args.heads
    d = args.head_dim or c // h
    others = ("context", "context_dim", "key_dim", "value_dim", "kv_heads", "out_dim")
    return (
        all(getattr(args, f) is None for f in others)
        and h * d == c
        and args.v_head_dim in (None, d)
    )


def _mha_closed_form(args: argparse.Namespace, n: int) -> tuple[str, int]:
    """The textbook expression when it applies, else the general one, with numbers."""
    c, h = args.dim, args.heads
    d = args.head_dim or c // h
    dv = args.v_head_dim or d
    if textbook(args):
        if args.out_proj:
            return f"4NC² + 2N²C = 4·{n}·{c}² + 2·{n}²·{c}", 4 * n * c * c + 2 * n * n * c
        # no W_O: one head's count, whatever H (Vaswani et al. 2017, §3.2)
        return f"3NC² + 2N²C = 3·{n}·{c}² + 2·{n}²·{c}", 3 * n * c * c + 2 * n * n * c
    s, g, co = args.context or n, args.kv_heads or h, args.out_dim or c
    ck = args.context_dim or args.key_dim or c
    cv = args.context_dim or args.value_dim or ck
    if ck == cv and dv == d:
        text = "N·C·Hd + 2·S·C'·Gd + 2·H·N·S·d"
        numbers = f"{n}·{c}·{h * d} + 2·{s}·{ck}·{g * d} + 2·{h}·{n}·{s}·{d}"
        out = " + N·Hd·C_out"
    else:
        text = "N·C·Hd_k + S·C_k·Gd_k + S·C_v·Gd_v + H·N·S·(d_k + d_v)"
        numbers = (
            f"{n}·{c}·{h * d} + {s}·{ck}·{g * d} + {s}·{cv}·{g * dv} + {h}·{n}·{s}·({d} + {dv})"
        )
        out = " + N·Hd_v·C_out"
    value = n * c * h * d + s * ck * g * d + s * cv * g * dv + h * n * s * (d + dv)
    if args.out_proj:
        text, numbers = text + out, numbers + f" + {n}·{h * dv}·{co}"
        value += n * h * dv * co
    return f"{text} = {numbers}", value
