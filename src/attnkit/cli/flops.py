"""`attnkit flops`: MACs, FLOPs, parameters and memory of an attention layer or a model.

Counts are exact for attnkit's modules (FLOPs = 2 × MACs: one multiply and one add per
multiply-accumulate); nothing is run, except with --plot, which also times attention on
this machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.cli._common import add_out_options, add_report_options, emit, prepare_out
from attnkit.cli._errors import UsageError
from attnkit.cli._flops_format import elementwise_line, parts_table
from attnkit.cli._flops_layer import layer_report
from attnkit.cli.flops_mask import mask_spec

PROG = "attnkit flops"

EPILOG = """\
examples:
  attnkit flops --tokens 197 --dim 768 --heads 12
  attnkit flops --tokens 4096 --dim 4096 --heads 32 --kv-heads 8 --causal
  attnkit flops --tokens 4096 --dim 512 --heads 8 --mask window:256 --causal
  attnkit flops --dim 512 --heads 8 --mask document:512,512,1024 --causal
  attnkit flops --tokens 197 --dim 768 --heads 1 --no-out-proj
  attnkit flops --tokens 9 --dim 64 --heads 4 --context 20 --key-dim 32 --value-dim 48
  attnkit flops --grid 56x56 --window 7 --dim 96 --heads 3
  attnkit flops --model vit --json
  attnkit flops --model bert --seq-len 512 --quiet
  attnkit flops --dim 384 --heads 6 --plot --plot-max-tokens 784

Nothing is written except with --plot (a PNG in --out).
exit codes: 0 done, 2 bad usage, 130 interrupted (Ctrl-C)."""

# Help for the options of the size groups below, kept apart from the option list so that
# options added there merge cleanly; applied by _user_help() (an option missing here keeps
# its own help).
HELP = {
    "--tokens": "query tokens N (with --model bert|transformer: the sequence length)",
    "--dim": "model width C, the size of each token's vector (required without --model)",
    "--heads": "attention heads H; must divide --dim unless --head-dim is given",
    "--context": "key/value tokens S for cross-attention (default: S = N, self-attention)",
    "--context-dim": "width of the key/value input for cross-attention (default: --dim)",
    "--kv-heads": "key/value heads G for grouped-query (G < H) or multi-query (G = 1) "
    "attention; must divide --heads (default: H)",
    "--head-dim": "width d of each head (default: --dim / --heads)",
    "--out-dim": "width of the output projection (default: --dim)",
    "--window": "Swin window attention over windows of M×M tokens (needs --grid)",
    "--grid": "token grid rows x columns for --window, e.g. 56x56 (then N = 3136)",
    "--shifted": "shifted windows (Swin SW-MSA): the same cost, counted with the shift",
    "--causal": "causal mask: also reports the products a mask-skipping kernel saves",
    "--mask": "a structured mask: window:W (sliding window: keys less than W positions "
    "away, the last W with --causal), document:L1,L2,... (packed documents of these lengths; "
    "N defaults to their sum) or prefix:P (prefix-LM: the first P keys bidirectional); "
    "repeat it to AND masks; reports the score entries the mask allows and the blocks "
    "attnkit's compiled kernel computes",
    "--batch": "batch size B; every count scales with it (default 1)",
    "--model": "a whole model, part by part: bert (all-MiniLM-L6-v2: 6 layers, C=384, H=12, "
    "N=128), vit (ViT-B/16 at 224×224) or transformer (base: 6+6 layers, C=512, N=128)",
    "--layers": "number of layers (transformer: of the encoder and of the decoder each)",
    "--seq-len": "tokens per sequence (bert; transformer source) (default 128)",
    "--tgt-len": "target tokens (transformer) (default: --seq-len)",
    "--ff": "feed-forward hidden width (default: 4 × --dim for the presets)",
    "--image": "image side in pixels (vit) (default 224)",
    "--patch": "patch side in pixels (vit) (default 16)",
}

# Defaults per model: MiniLM-L6 (all-MiniLM-L6-v2), ViT-B/16 at 224², Transformer base.
MODEL_DEFAULTS = {
    "bert": {"layers": 6, "dim": 384, "heads": 12, "ff": 1536, "seq_len": 128},
    "vit": {"layers": 12, "dim": 768, "heads": 12, "image": 224, "patch": 16},
    "transformer": {"layers": 6, "dim": 512, "heads": 8, "ff": 2048, "seq_len": 128},
}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "flops",
        help="MACs, FLOPs, parameters and memory of attention layers and models",
        description=__doc__.split("\n\n", 1)[1].strip(),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    layer = p.add_argument_group("one attention layer")
    layer.add_argument("--tokens", type=int, metavar="N", help="query tokens N")
    layer.add_argument("--dim", type=int, metavar="C", help="model width C")
    layer.add_argument("--heads", type=int, metavar="H", help="query heads H")
    layer.add_argument("--context", type=int, metavar="S", help="key/value tokens S (cross)")
    layer.add_argument("--context-dim", type=int, metavar="C2", help="context width (cross)")
    layer.add_argument(
        "--key-dim", type=int, metavar="CK", help="key input width (default C2 or C)"
    )
    layer.add_argument("--value-dim", type=int, metavar="CV", help="value input width (default CK)")
    layer.add_argument("--kv-heads", type=int, metavar="G", help="key/value heads (GQA/MQA)")
    layer.add_argument(
        "--head-dim", type=int, metavar="D", help="query/key head width (default C/H)"
    )
    layer.add_argument("--v-head-dim", type=int, metavar="DV", help="value head width (default D)")
    layer.add_argument("--out-dim", type=int, metavar="C3", help="output width (default C)")
    layer.add_argument(
        "--no-out-proj",
        dest="out_proj",
        action="store_false",
        help="no output projection W_O (self-attention: 3NC² + 2N²C)",
    )
    layer.add_argument("--window", type=int, metavar="M", help="Swin window of M×M patches")
    layer.add_argument("--grid", metavar="HxW", help="token grid for --window, e.g. 56x56")
    layer.add_argument("--shifted", action="store_true", help="shifted windows (SW-MSA)")
    layer.add_argument("--causal", action="store_true", help="causal mask")
    layer.add_argument(
        "--mask", action="append", type=mask_spec, metavar="KIND:ARG", help="structured mask"
    )
    layer.add_argument("--batch", type=int, default=1, metavar="B", help="batch size (1)")
    model = p.add_argument_group("a whole model")
    model.add_argument("--model", choices=sorted(MODEL_DEFAULTS), help="per-layer breakdown")
    model.add_argument("--layers", type=int, help="layers / depth (enc and dec each)")
    model.add_argument("--seq-len", type=int, help="tokens (bert, transformer source)")
    model.add_argument("--tgt-len", type=int, help="target tokens (transformer)")
    model.add_argument("--ff", type=int, help="feed-forward width")
    model.add_argument("--image", type=int, help="image side in pixels (vit)")
    model.add_argument("--patch", type=int, help="patch side in pixels (vit)")
    _user_help(p)
    plot = p.add_argument_group("a plot of cost and measured time against length")
    plot.add_argument(
        "--plot",
        nargs="?",
        const="cost.png",
        metavar="NAME.png",
        help="draw global vs Swin window attention (formula GFLOPs and the forward time "
        "measured here, one thread, ~20 s) for tokens 64 to 3136 at --dim/--heads/--window "
        "(defaults 384/6/7) into --out/NAME.png (default name cost.png)",
    )
    plot.add_argument(
        "--plot-max-tokens",
        type=int,
        default=3136,
        metavar="N",
        help="measure only grids of up to N tokens (at least 64; default 3136 = 56×56)",
    )
    add_out_options(p, "flops", "the --plot picture")
    add_report_options(p)
    p.set_defaults(run=run)


def _user_help(p: argparse.ArgumentParser) -> None:
    for action in p._actions:
        for flag in action.option_strings:
            if flag in HELP:
                action.help = HELP[flag]


SIZE_OPTIONS = ("tokens", "dim", "heads", "context", "context_dim", "key_dim", "value_dim",
                "kv_heads", "head_dim", "v_head_dim", "out_dim", "window", "batch", "layers",
                "seq_len", "tgt_len", "ff", "image", "patch")  # fmt: skip


def _check_sizes(args: argparse.Namespace) -> None:
    for name in SIZE_OPTIONS:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.model == "vit" and (args.tokens is not None or args.seq_len is not None):
        raise ValueError(
            "--model vit takes no --tokens/--seq-len: its tokens come from --image and --patch"
        )
    if args.model != "transformer" and args.model and args.tgt_len is not None:
        raise ValueError("--tgt-len is for --model transformer only")
    if args.model or args.plot:
        kv = ("key_dim", "value_dim", "v_head_dim")
        given = [f"--{f.replace('_', '-')}" for f in kv if getattr(args, f) is not None]
        given += [] if args.out_proj else ["--no-out-proj"]
        given += ["--mask"] if args.mask and args.model else []
        if given:
            where = "--model" if args.model else "--plot"
            raise ValueError(f"{where} does not take {', '.join(given)} (one layer's options)")
    if args.context_dim is not None:
        for flag, width in (("--key-dim", args.key_dim), ("--value-dim", args.value_dim)):
            if width is not None and width != args.context_dim:
                raise ValueError(
                    f"--context-dim {args.context_dim} sets --key-dim and --value-dim; "
                    f"got {flag} {width}"
                )


def run(args: argparse.Namespace) -> int:
    try:
        _check_sizes(args)
        if args.plot is not None:
            return _run_plot(args)
        report = _model_report(args) if args.model else layer_report(args)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not (args.json or args.quiet):
        print(report["text"])
    cost = report["json"]
    line = (
        f"{report['what']}: {cost['macs']:,} MACs = {cost['flops'] / 1e9:,.3g} GFLOPs, "
        f"{cost['params']:,} params (nothing written; --plot draws cost against length)"
    )
    emit(args, "flops", cost, line)
    return 0


# Options --plot would ignore (it measures square grids of one layer): refused, not ignored.
PLOT_IGNORES = ("tokens", "context", "context_dim", "kv_heads", "head_dim", "out_dim", "grid",
                "shifted", "causal", "mask", "model", "layers", "seq_len", "tgt_len", "ff", "image",
                "patch")  # fmt: skip


def _run_plot(args: argparse.Namespace) -> int:
    from attnkit.cli.flops_plot import GRIDS, check_memory

    if Path(args.plot).name != args.plot or not args.plot.lower().endswith(".png"):
        raise ValueError(
            f"--plot takes a file name ending in .png, written inside --out, got {args.plot!r}: "
            "give the folder with --out DIR"
        )
    ignored = [
        f"--{n.replace('_', '-')}" for n in PLOT_IGNORES if getattr(args, n) not in (None, False)
    ]
    if ignored or args.batch != 1:
        raise ValueError(
            f"--plot draws one layer of --dim, --heads and --window only: leave out "
            f"{', '.join(ignored or ['--batch'])}"
        )
    if args.plot_max_tokens < GRIDS[0] ** 2:
        raise ValueError(f"--plot-max-tokens must be at least {GRIDS[0] ** 2}")
    dim, heads, window = args.dim or 384, args.heads or 6, args.window or 7
    if dim % heads:
        raise ValueError(f"--heads {heads} must divide --dim {dim}")
    check_memory(dim, heads, max(g * g for g in GRIDS if g * g <= args.plot_max_tokens))
    out = prepare_out(args.out, [args.plot], force=args.force)

    from attnkit.cli.flops_plot import plot

    grids = tuple(g for g in GRIDS if g * g <= args.plot_max_tokens)
    path = out / args.plot
    data = plot(path, dim=dim, heads=heads, window=window, grids=grids, quiet=args.quiet)
    first, last = data["rows"][0]["n"], data["rows"][-1]["n"]
    line = (
        f"measured global vs {window}×{window} window attention (C={dim}, H={heads}) for "
        f"N={first}..{last} tokens; wrote {args.plot} to {out}/"
    )
    summary = {"dim": dim, "heads": heads, "window": window, **data}
    emit(args, "flops", {**summary, "out": str(out), "files": [str(path)]}, line)
    return 0


# --------------------------------------------------------------------------- a model


def _model_report(args: argparse.Namespace) -> dict:
    from attnkit.analysis import bert_cost, transformer_cost, vit_cost

    cfg = dict(MODEL_DEFAULTS[args.model])
    for key in ("layers", "dim", "heads", "ff", "seq_len", "image", "patch"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if cfg["dim"] % cfg["heads"]:
        raise ValueError(f"--heads {cfg['heads']} must divide --dim {cfg['dim']}")
    b = args.batch
    if args.model == "bert":
        seq = args.tokens or cfg["seq_len"]
        cost = bert_cost(cfg["layers"], cfg["dim"], cfg["heads"], cfg["ff"], seq, batch=b)
        title = f"BERT  L={cfg['layers']}  C={cfg['dim']}  H={cfg['heads']}  N={seq}"
    elif args.model == "vit":
        cost = vit_cost(cfg["image"], cfg["patch"], cfg["dim"], cfg["layers"], cfg["heads"],
                        batch=b)  # fmt: skip
        n = (cfg["image"] // cfg["patch"]) ** 2 + 1
        title = f"ViT  {cfg['image']}²/{cfg['patch']}  depth={cfg['layers']}  C={cfg['dim']}"
        title += f"  H={cfg['heads']}  N={n}"
    else:
        src = args.tokens or cfg["seq_len"]
        tgt = args.tgt_len or src
        cost = transformer_cost(src, tgt, cfg["dim"], cfg["heads"], cfg["ff"], cfg["layers"],
                                cfg["layers"], batch=b)  # fmt: skip
        title = f"Transformer  {cfg['layers']}+{cfg['layers']} layers  C={cfg['dim']}"
        title += f"  S={src}  N={tgt}"
    lines = [f"{title}  B={b}", "", *parts_table(cost), ""]
    total = cost.total
    lines.append(f"backward ≈ 2 × forward: {total.backward_macs:,} MACs")
    lines.append(elementwise_line(total))
    data = {"model": args.model, **cfg, **cost.to_dict()}
    return {"text": "\n".join(lines), "json": data, "what": title.split("  ")[0]}
