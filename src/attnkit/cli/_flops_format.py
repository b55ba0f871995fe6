"""Text formatting of `attnkit flops` reports: aligned tables, shares, byte sizes."""

from __future__ import annotations

import math


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned numbers; the last row (the total) ruled off."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join([f"{{:<{widths[0]}}}"] + [f"{{:>{w}}}" for w in widths[1:]])
    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    return [
        fmt.format(*header),
        rule,
        *(fmt.format(*r) for r in rows[:-1]),
        rule,
        fmt.format(*rows[-1]),
    ]


def share(part: int, total: int) -> str:
    return f"{100 * part / total:.1f}%" if total else "-"


def term_table(cost) -> list[str]:
    rows = [[k, f"{v:,}", f"{2 * v:,}", share(v, cost.macs)] for k, v in cost.terms.items()]
    rows.append(["total (matmul)", f"{cost.macs:,}", f"{cost.flops:,}", "100.0%"])
    return table(["term", "MACs", "FLOPs", "share"], rows)


def parts_table(model) -> list[str]:
    total = model.total
    rows = [
        [name, f"{c.macs:,}", f"{c.flops:,}", f"{c.params:,}", share(c.macs, total.macs)]
        for name, c in model.parts.items()
    ]
    rows.append(["total", f"{total.macs:,}", f"{total.flops:,}", f"{total.params:,}", "100.0%"])
    return table(["part", "MACs", "FLOPs", "params", "share"], rows)


def elementwise_line(cost) -> str:
    lines = ["not matmuls, not in the totals (FLOPs):"]
    items = [f"{k} {v:,}" for k, v in cost.elementwise.items()]
    for i, item in enumerate(items):  # a name and its count stay on one line ("position bias")
        item += "," if i < len(items) - 1 else ""
        if len(lines[-1]) + 1 + len(item) > 100:
            lines.append(" ")
        lines[-1] += " " + item
    return "\n".join(lines)


def format_bytes(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    exp = min(int(math.log(n, 1024)), 3)
    return f"{n / 1024**exp:,.1f} {('KiB', 'MiB', 'GiB')[exp - 1]} ({n:,} B)"
