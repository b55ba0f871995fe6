"""The parser of every command, fed random argument lists: it parses, or it exits 2 with one
line on stderr (never a traceback); and building it imports no torch."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.cli.main import build_parser

COMMANDS = ["explain", "explain-image", "train", "eval", "seq2seq", "lm", "flops", "bench", "nope"]
WORDS = [
    "--out", "--force", "--json", "--quiet", "--layers", "--heads", "--focus", "--top",
    "--checkpoint", "--tokens", "--dim", "--kv-heads", "--model", "--ff", "--epochs", "--lr",
    "--resume", "--max-len", "--task", "--sizes", "--threads", "--no-memory", "--quick",
    "--text", "--prompt", "--top-p", "--temperature", "sample",
    "train", "decode", "vit", "cnn", "bert", "reverse", "0", "-1", "3-5", "0,11", "5-3", "1e400",
    "nan", "", " ", "x" * 300, "☂", "--", "-", "--unknown",
]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(COMMANDS),
    st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)), max_size=6),
)
def test_random_arguments_parse_or_exit_2_with_one_line(command, rest):
    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args([command, *rest])
            return
        except SystemExit as e:
            code = e.code
    text = err.getvalue()
    assert code == 2, (code, text)
    assert "Traceback" not in text
    assert len(text.strip().splitlines()) == 1, text


def test_building_the_parser_imports_no_torch():
    code = (
        "import sys; from attnkit.cli.main import build_parser; build_parser(); "
        "heavy = [m for m in ('torch', 'numpy', 'matplotlib', 'transformers', 'sklearn') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_needs_no_torch():
    code = "import sys, attnkit; print(attnkit.__version__, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, loaded = out.stdout.split()
    assert loaded == "False" and version.count(".") == 2


def test_seq2seq_and_train_spell_the_library_names():
    from attnkit.cli import seq2seq, train
    from attnkit.models.vit import PRESETS
    from attnkit.seq2seq.tasks import TASKS
    from attnkit.seq2seq.train import TrainConfig

    assert tuple(sorted(PRESETS)) == train.PRESET_NAMES
    assert tuple(TASKS) == seq2seq.TASKS
    from attnkit.models.rnn import ATTENTIONS, CELLS
    from attnkit.seq2seq.kinds import KINDS

    assert (KINDS, CELLS, ATTENTIONS) == (seq2seq.KINDS, seq2seq.CELLS, seq2seq.ATTENTIONS)
    d = TrainConfig()
    assert {k: getattr(d, k) for k in seq2seq.TRAIN_DEFAULTS} == seq2seq.TRAIN_DEFAULTS
