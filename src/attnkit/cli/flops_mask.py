"""`attnkit flops --mask`: the score entries a structured mask allows and the kernel computes.

`--mask window:W`, `document:L1,L2,...` (the lengths of packed documents) or `prefix:P`,
repeatable (the masks are ANDed) and combined with `--causal` as `attnkit.attention` does.
The counts come from `attnkit.analysis.kernel_work`, which walks the compiled kernel's blocks
(equal to its own counter, tested). Imports nothing heavy until a mask is built: `attnkit
--help` builds every parser.
"""

from __future__ import annotations

import argparse

from attnkit.cli._flops_format import share, table

__all__ = ["mask_lines", "mask_spec", "mask_tokens", "mask_work"]

KINDS = {
    "window": "window:W (keys less than W positions away; the last W with --causal)",
    "document": "document:L1,L2,... (the lengths of packed documents)",
    "prefix": "prefix:P (the first P keys seen by every query, causal after them)",
}
USAGE = "write window:W, document:L1,L2,... or prefix:P"
# --mask builds the mask and walks the kernel's blocks one by one (seconds at 2^20 tokens)
MAX_TOKENS = 1 << 20


def mask_spec(text: str) -> tuple[str, tuple[int, ...]]:
    """argparse type of --mask: 'window:256' -> ('window', (256,)); errors name the value."""
    kind, colon, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS or not colon:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mask: {USAGE}")
    parts = [p.strip() for p in arg.split(",")]
    if not all(p.isdigit() for p in parts) or (kind != "document" and len(parts) != 1):
        raise argparse.ArgumentTypeError(f"{text!r}: write {KINDS[kind]}, whole numbers")
    values = tuple(int(p) for p in parts)
    if kind != "prefix" and min(values) < 1:
        what = "the window" if kind == "window" else "every document length"
        raise argparse.ArgumentTypeError(f"{text!r}: {what} must be at least 1")
    return kind, values


def _label(spec: tuple[str, tuple[int, ...]]) -> str:
    return f"{spec[0]}:{','.join(str(v) for v in spec[1])}"


def mask_tokens(specs: list, n: int | None) -> int | None:
    """N from the document lengths where --tokens is not given; a ValueError naming --mask
    where they disagree with it (or with each other)."""
    for spec in specs:
        if spec[0] == "document":
            total = sum(spec[1])
            if n is not None and n != total:
                raise ValueError(
                    f"--mask {_label(spec)} covers {total} tokens but N = {n}: the document "
                    "lengths must add up to --tokens"
                )
            n = total
    return n


def _build(specs: list, n: int, s: int):  # -> StructuredMask
    """The structured mask of the --mask options (ANDed), for N queries and S keys."""
    if max(n, s) > MAX_TOKENS:
        raise ValueError(
            f"--mask counts the kernel's blocks one by one: up to {MAX_TOKENS:,} tokens, got "
            f"N={n:,}, S={s:,}"
        )
    from attnkit import masks

    built = []
    for spec in specs:
        kind, values = spec
        if kind == "window":
            built.append(masks.window(n, values[0], s))
        elif kind == "prefix":
            if values[0] > s:
                raise ValueError(f"--mask {_label(spec)} is longer than the {s} keys")
            built.append(masks.prefix(n, values[0], s))
        else:
            if s != n:
                raise ValueError(f"--mask {_label(spec)} is for self-attention: drop --context")
            built.append(masks.document(masks.document_ids(list(values))))
    mask = built[0]
    for more in built[1:]:
        mask = mask & more
    return mask


def mask_work(args: argparse.Namespace, n: int) -> dict:
    """The mask of the --mask options (and --causal) for N queries and --context keys, and
    `kernel_work` of both passes: {"mask": StructuredMask, "summary": the JSON part}."""
    from attnkit.analysis import kernel_work

    causal, mask = args.causal, _build(args.mask, n, args.context or n)
    label = " & ".join(_label(spec) for spec in args.mask) + (" & causal" if causal else "")
    fwd, bwd = (
        kernel_work(mask, causal=causal, pass_=p, batch=args.batch, heads=args.heads)
        for p in ("forward", "backward")
    )
    summary = {
        "mask": label,
        "density": fwd.allowed / fwd.dense if fwd.dense else 0.0,
        "dense": fwd.dense,
        "allowed": fwd.allowed,
        "forward": {k: v for k, v in fwd.to_dict().items() if k not in ("dense", "allowed")},
        "backward": {k: v for k, v in bwd.to_dict().items() if k not in ("dense", "allowed")},
    }
    return {"mask": mask, "summary": summary}


def _entry_rows(summary: dict) -> list[list[str]]:
    """Rows of the score-entry table: allowed, computed forward and backward, dense last."""
    dense, allowed = summary["dense"], summary["allowed"]
    rows = [["allowed by the mask", f"{allowed:,}", share(allowed, dense), "-"]]
    for name in ("forward", "backward"):
        w = summary[name]
        blocks = f"{w['blocks']:,} of {w['block_q']}×{w['block_k']}"
        rows.append(
            [f"computed, {name}", f"{w['computed']:,}", share(w["computed"], dense), blocks]
        )
    rows.append(["dense (B·H·N·S)", f"{dense:,}", "100.0%", "-"])
    return rows


def mask_lines(summary: dict, cost, n: int, args, *, textbook: bool) -> list[str]:
    """The report's mask part: the closed forms with the allowed pairs A and the computed
    entries K per head (textbook self-attention: 4NC² + 2·A·C, each checked against the
    formula), the MACs attnkit's kernel computes, and the table of score entries."""
    lines = [f"mask: {summary['mask']}, density {summary['density']:.4f}"]
    proj, c, per_head = (4 if args.out_proj else 3), args.dim, args.batch * args.heads
    kernel = "attnkit's compiled kernel, in whole blocks"
    for what, sym, total, want in (
        ("allowed", "A", summary["allowed"], cost.unmasked_macs),
        ("computed", "K", summary["forward"]["computed"], cost.computed_macs),
    ):
        if not textbook:
            note = "skipping every masked product" if sym == "A" else kernel
            lines.append(f"{what}: {want:,} MACs ({note})")
            continue
        k = total // per_head  # the CLI's masks are the same for every batch row and head
        form = f"{proj}NC² + 2·{sym}·C = {proj}·{n}·{c}² + 2·{k}·{c}"
        value = args.batch * (proj * n * c * c + 2 * k * c)
        if value != want:  # the closed form is an independent check of the formula
            raise RuntimeError(f"closed form {value} != formula {want}: a bug in attnkit")
        form = f"B·({form})" if args.batch > 1 else form
        note = "pairs a head may attend" if sym == "A" else "entries per head, " + kernel
        lines.append(f"{what}: {form} = {value:,} MACs ({sym}: {note})")
    header = ["score entries", "entries", "share", "blocks"]
    return [*lines, "", *table(header, _entry_rows(summary)), ""]
