"""Every documentation page's code runs and prints what the page shows, in both languages.

The English page of each pair is executed; its Chinese twin must carry the identical code and
outputs (only the prose is translated), so running it again would prove nothing new.

ATTNKIT_DOCS_UPDATE=1 turns the output checks into a report: the actual outputs of each page
go to /tmp/attnkit-docs-actual/<lang>/<page> and the pictures the tutorials make are copied
into docs/assets/, for the author to paste and commit.
"""

from __future__ import annotations

import base64
import os
import posixpath
import re
import shutil
from pathlib import Path

import pytest

from tests.docs import legibility, make_examples, twins
from tests.docs.pages import (
    DOCS,
    LANGS,
    ROOT,
    images,
    matches,
    mismatches,
    pages,
    parse,
    png_size,
    relative_pages,
    run,
)

UPDATE = os.environ.get("ATTNKIT_DOCS_UPDATE") == "1"
ACTUAL = Path("/tmp/attnkit-docs-actual")
GENERATED_IMAGES = DOCS / "assets" / "tutorials"
ZH_IMAGES = GENERATED_IMAGES / "zh"  # the same figures drawn with lang="zh" by the Chinese pages

_EXECUTED = [p for p in pages("en") if parse(p.read_text(encoding="utf-8"))]


def _id(page: Path) -> str:
    return str(page.relative_to(DOCS / "en"))


_IFRAME = re.compile(r'<iframe[^>]*\ssrc="([^":]+\.html)"')


def embedded(page: Path) -> list[Path]:
    """The local HTML files a page embeds with <iframe src=...>. Raw HTML is not rewritten by
    mkdocs, so the src is relative to the built page (site/[zh/]<path>/index.html), one level
    deeper in Chinese; resolved here against that layout, where site/assets is docs/assets."""
    lang = page.relative_to(DOCS).parts[0]
    rel = page.relative_to(DOCS / lang).with_suffix("")  # use_directory_urls: a/b.md -> a/b/
    folder = rel.parent if rel.name == "index" else rel
    built = posixpath.join("/", "" if lang == "en" else lang, folder.as_posix())
    return [
        DOCS / posixpath.normpath(posixpath.join(built, src)).lstrip("/")
        for src in _IFRAME.findall(page.read_text(encoding="utf-8"))
    ]


_WEIGHTS = re.compile(r'"weights":"([^"]*)"')


def same_head_view(produced: str, committed: str) -> bool:
    """Whether two head-view pages are the same but for their quantised weights (one step of
    1/255 apart where another CPU rounds a float32 sum the other way) and the kept-mass %."""
    a, b = _WEIGHTS.search(produced), _WEIGHTS.search(committed)
    if a is None or b is None:
        return produced == committed
    wa, wb = (bytearray(base64.b64decode(m.group(1))) for m in (a, b))
    if len(wa) != len(wb) or any(abs(x - y) > 1 for x, y in zip(wa, wb, strict=True)):
        return False
    rest = [_WEIGHTS.sub("", t) for t in (produced, committed)]
    rest = [re.sub(r"They carry [0-9.]+%", "", t) for t in rest]
    return rest[0] == rest[1]


def test_every_page_exists_in_both_languages():
    english, chinese = relative_pages("en"), relative_pages("zh")
    assert english - chinese == set(), f"pages without a Chinese twin: {sorted(english - chinese)}"
    assert chinese - english == set(), f"pages without an English twin: {sorted(chinese - english)}"


@pytest.mark.parametrize("rel", sorted(relative_pages("en") & relative_pages("zh")), ids=str)
def test_both_languages_show_the_same_code_and_outputs(rel):
    english, chinese = (parse((DOCS / lang / rel).read_text(encoding="utf-8")) for lang in LANGS)
    bad = twins.differences(english, chinese)
    assert not bad, (
        f"docs/zh/{rel} and docs/en/{rel} differ in their code or output blocks (translate "
        "the prose, comments and labels, never the code or the numbers):\n" + "\n".join(bad)
    )


def test_twins_may_differ_in_comments_and_chinese_labels_only():
    english = parse(
        "```python\nx = 0.5  # half\nprint(f'mean {x}', 'n')\n```\n\n```text\nmean 0.5 n\n```\n"
    )

    def zh(code: str, output: str) -> list[str]:
        return twins.differences(
            english, parse(f"```python\n{code}\n```\n\n```text\n{output}\n```\n")
        )

    assert zh("x = 0.5  # 一半\nprint(f'均值 {x}', 'n')", "均值 0.5 n") == []
    assert zh("x = 0.5\nprint(f'mean {x}', 'n')", "mean 0.5 n") == []
    assert zh("x = 0.6  # 一半\nprint(f'均值 {x}', 'n')", "均值 0.5 n")  # other code
    assert zh("x = 0.5\nprint(f'均值 {x}', 'm')", "均值 0.5 n")  # a non-Chinese string
    assert zh("x = 0.5\nprint(f'均值 {x}', 'n')", "均值 0.6 n")  # another number
    assert zh("x = 0.5\nprint(f'均值 {x}', 'n')", "mean 0.5 m")  # English text changed
    assert zh("x = 0.5\nprint(f'均值 {x}', 'n'", "均值 0.5 n")  # does not compile
    assert zh("x = 0.5\nprint(f'均值 {x}', 'n')", "均值 0.5 n\n多一行")  # another line count
    figure = parse('```python\nfig = draw(x, lang="en")\n```\n')
    assert twins.differences(figure, parse('```python\nfig = draw(x, lang="zh")\n```\n')) == []
    assert twins.differences(figure, parse('```python\nfig = draw(x, lang="fr")\n```\n'))
    assert twins.differences(  # "zh" for "en" only, not for any string
        parse("```python\nfig = draw(x, 'a')\n```\n"),
        parse("```python\nfig = draw(x, 'zh')\n```\n"),
    )


@pytest.mark.parametrize("rel", sorted(relative_pages("en") | relative_pages("zh")), ids=str)
def test_every_image_a_page_shows_is_committed(rel):
    for lang in LANGS:
        page = DOCS / lang / rel
        if page.exists():
            missing = [str(p) for p in images(page) + embedded(page) if not p.exists()]
            assert not missing, f"{page.relative_to(ROOT)} shows missing images: {missing}"


def zh_twin(image: Path) -> Path:
    """Where the Chinese page's version of a figure the English page draws lives."""
    return ZH_IMAGES / image.relative_to(GENERATED_IMAGES)


def _generated(page: Path) -> list[Path]:
    return [p for p in images(page) + embedded(page) if GENERATED_IMAGES in p.parents]


def _assert_legible(page: Path, saved: list[legibility.Saved]) -> None:
    small = [s for s in saved if s.shown_px < legibility.MIN_PX]
    assert not small, f"{_id(page)}: text under {legibility.MIN_PX:g} px on the site: " + "; ".join(
        f"{s.text!r} is {s.shown_px:.1f} px in a {s.width_px:.0f} px wide figure" for s in small
    )


@pytest.mark.parametrize("page", _EXECUTED, ids=_id)
def test_page_code_prints_what_the_page_shows(page, tmp_path):
    with legibility.recording() as saved:
        results = run(page, tmp_path)
    made = _generated(page)
    if UPDATE:
        _write_actual(page, results)
        _copy_made(made, tmp_path)
        chinese = DOCS / "zh" / page.relative_to(DOCS / "en")
        (tmp_path / "zh").mkdir()
        with legibility.recording() as saved_zh:
            run(chinese, tmp_path / "zh")  # its figures, drawn with lang="zh"
        _copy_made([zh_twin(p) for p in made], tmp_path / "zh")
        _assert_legible(page, saved + saved_zh)
        return
    bad = mismatches(page, results)
    assert not bad, "\n\n".join(bad)
    _assert_legible(page, saved)
    for image in made:
        produced = tmp_path / image.name
        assert produced.exists(), (
            f"{_id(page)} shows {image.relative_to(ROOT)} but its code did not write "
            f"{image.name} in the current directory"
        )
        if image.suffix == ".png":
            assert png_size(produced) == png_size(image), (
                f"{image.relative_to(ROOT)} is not what the page's code draws now "
                f"({png_size(image)} vs {png_size(produced)}); regenerate with "
                "ATTNKIT_DOCS_UPDATE=1"
            )
        if image.suffix == ".html":
            assert same_head_view(produced.read_text("utf-8"), image.read_text("utf-8")), (
                f"{image.relative_to(ROOT)} is not what the page's code writes now; "
                "regenerate with ATTNKIT_DOCS_UPDATE=1"
            )


def _copy_made(made: list[Path], workdir: Path) -> None:
    for image in made:
        if (workdir / image.name).exists():
            image.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(workdir / image.name, image)


@pytest.mark.parametrize("page", _EXECUTED, ids=_id)
def test_chinese_pages_show_the_chinese_figures(page):
    """Each figure the English page draws appears on the Chinese page as its zh twin (drawn
    by the same code with lang="zh", Chinese labels), the same size as the English one."""
    chinese = DOCS / "zh" / page.relative_to(DOCS / "en")
    english = [p for p in _generated(page) if ZH_IMAGES not in p.parents]
    assert _generated(chinese) == [zh_twin(p) for p in english], (
        f"docs/zh/{_id(page)} must show the Chinese figures under docs/assets/tutorials/zh/"
    )
    for image in english:
        if image.suffix == ".png" and zh_twin(image).exists():
            assert png_size(zh_twin(image)) == png_size(image), (
                f"{zh_twin(image).relative_to(ROOT)} is not the size of {image.name}: "
                "regenerate both with ATTNKIT_DOCS_UPDATE=1"
            )


def _write_actual(page: Path, results) -> None:
    target = ACTUAL / page.relative_to(DOCS)
    target.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    for block, outs in results:
        parts.append(f"<!-- line {block.line} ({block.kind}) -->")
        if block.kind == "python":
            parts.append("```python\n" + block.code + "\n```\n\n```text\n" + outs[0].rstrip())
            parts.append("```")
        else:
            body = "".join(
                f"$ {cmd}\n{out}" for (cmd, _), out in zip(block.commands, outs, strict=True)
            )
            parts.append("```console\n" + body.rstrip() + "\n```")
    target.write_text("\n".join(parts) + "\n", encoding="utf-8")


def test_tutorial_examples_are_in_sync_with_their_pages():
    stale = make_examples.stale()
    assert not stale, (
        f"out of date: {[str(p.relative_to(ROOT)) for p in stale]}; "
        "run python tests/docs/make_examples.py"
    )


# The runner itself: it must be able to fail.


def test_runner_pairs_outputs_and_reads_console_blocks():
    page = (
        "# t\n\n```python\nprint(2 + 2)\n```\n\n```text\n4\n```\n\nprose\n\n```text\nfree\n```\n\n"
        "```python\nx = 1\n```\n\n```console\n$ attnkit --version\nattnkit ...\n```\n"
        "```bash\npip install attnkit\n```\n"
    )
    blocks = parse(page)
    assert [b.kind for b in blocks] == ["python", "python", "console"]
    assert blocks[0].expected == "4" and blocks[1].expected is None
    assert blocks[2].commands == [("attnkit --version", "attnkit ...\n")]
    with pytest.raises(ValueError, match="only `\\$ attnkit"):
        parse("```console\n$ rm -rf /\n```\n")
    with pytest.raises(ValueError, match="unclosed"):
        parse("```python\nprint(1)\n")


def test_runner_compares_with_ellipsis_and_catches_drift(tmp_path):
    assert matches("took ... s\ndone", "took 1.23 s\ndone  \n")
    assert matches("a\n...\nz", "a\nb\nc\nz")
    assert not matches("4", "5")
    assert not matches("a", "a\nb")
    page = tmp_path / "p.md"
    page.write_text(
        "```python\nprint('now')\n```\n\n```text\nthen\n```\n\n"
        "```console\n$ attnkit --version\nattnkit ...\n"
        "$ attnkit --nonsense\nattnkit: error: unrecognized arguments: --nonsense ...\n```\n",
        encoding="utf-8",
    )
    work = tmp_path / "w"
    work.mkdir()
    with pytest.MonkeyPatch.context() as m:
        m.setattr("tests.docs.pages.ROOT", tmp_path)
        bad = mismatches(page, run(page, work))
    assert len(bad) == 1 and "then" in bad[0] and "now" in bad[0]  # the console lines match


@pytest.mark.parametrize(
    "example", sorted(make_examples.EXAMPLES.glob("*.py")), ids=lambda p: p.name
)
def test_tutorial_example_runs_as_a_script(example, tmp_path):
    """The runnable twin runs on its own, as a reader would start it: `python NN_name.py` in
    an empty folder (the page test ran the same code in one namespace; this runs the file)."""
    import subprocess
    import sys

    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(
        [sys.executable, str(example)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"{example.name} failed:\n{done.stderr[-3000:]}"


def test_embedded_pages_resolve_as_on_the_built_site(tmp_path):
    html = '<iframe src="{}assets/tutorials/x/view.html" title="t"></iframe>\n'
    for lang, up in (("en", "../../"), ("zh", "../../../")):
        page = tmp_path / lang / "tutorials" / "p.md"
        page.parent.mkdir(parents=True)
        page.write_text(html.format(up), encoding="utf-8")
        with pytest.MonkeyPatch.context() as m:
            m.setattr("tests.docs.test_pages.DOCS", tmp_path)
            assert embedded(page) == [tmp_path / "assets" / "tutorials" / "x" / "view.html"]
    view = '<p>They carry 99.1% of</p><script>{"weights":"W","keys":"AAE="}</script>'

    def page(weights):
        return view.replace("W", base64.b64encode(bytes(weights)).decode())

    one = page([10, 200, 3])
    assert same_head_view(one, page([11, 199, 3]))
    assert not same_head_view(one, page([12, 200, 3]))
    assert not same_head_view(one, one.replace("AAE=", "AAI="))
    assert same_head_view(one, one.replace("99.1%", "99.2%"))
