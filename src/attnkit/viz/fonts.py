"""The CJK font attnkit draws Chinese (Japanese, Korean) text with, and what to say without one.

matplotlib's and Pillow's default font, DejaVu Sans, has no CJK glyph: a Chinese label comes
out as empty boxes. attnkit's ``[viz]`` extra depends on ``noto-cjk-sans-otc`` (Noto Sans CJK,
SIL Open Font License 1.1, a 15 MB wheel); without it a system Noto Sans CJK / Source Han Sans
/ WenQuanYi file is used if one is found, else :data:`INSTALL_HINT` is the one line to show.

* matplotlib: :func:`use_cjk_font` appends the CJK family to ``rcParams["font.family"]``, so
  Latin text keeps DejaVu Sans and a CJK glyph falls back to Noto Sans CJK (matplotlib >= 3.6
  falls back glyph by glyph through the family list). The modules of `attnkit.viz` that draw
  with matplotlib call it when they load.
* Pillow (`attnkit.viz.raster`, no per-glyph fallback): :func:`cjk_font_file` and
  :func:`cjk_face_index` give the font to draw a whole label with.
* HTML (the head view): :func:`css_subset` embeds only the glyphs a page uses (a few KB).
"""

from __future__ import annotations

import base64
import functools
import io
import re
import warnings
from pathlib import Path

__all__ = [
    "CJK_CSS_FAMILIES",
    "INSTALL_HINT",
    "cjk_face_index",
    "cjk_font_file",
    "css_subset",
    "has_cjk",
    "use_cjk_font",
]

# CJK ideographs, radicals, punctuation, kana, hangul and full-width forms.
_CJK = re.compile(
    "[\u2e80-\u2fdf\u3000-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]"
)
FAMILY = "Noto Sans CJK SC"  # the Simplified Chinese face of the collection
INSTALL_HINT = (
    "no CJK font found, so Chinese, Japanese and Korean characters would show as empty "
    "boxes: pip install noto-cjk-sans-otc (part of attnkit[viz]), or install a system font "
    "such as Debian's fonts-noto-cjk"
)
# The head view's fallback list for CJK text, after its embedded subset: what Linux, macOS and
# Windows ship.
CJK_CSS_FAMILIES = (
    '"Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", '
    '"Hiragino Sans GB", "Microsoft YaHei", "WenQuanYi Micro Hei"'
)
# System files tried when the PyPI font is not installed (Debian, Fedora, Arch, macOS).
_SYSTEM_FILES = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/google-noto-cjk/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/noto-cjk/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/opentype/source-han-sans/SourceHanSans-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/System/Library/Fonts/PingFang.ttc",
)


def has_cjk(text: str) -> bool:
    """Whether `text` holds a CJK character (one DejaVu Sans cannot draw)."""
    return _CJK.search(text) is not None


@functools.cache
def cjk_font_file() -> Path | None:
    """The CJK font file attnkit draws with: the ``noto-cjk-sans-otc`` package's, else a
    system one; None when there is none."""
    try:
        import noto_cjk_sans_otc

        path = Path(str(noto_cjk_sans_otc.FONT_PATH))
        if path.is_file():
            return path
    except ImportError:
        pass
    return next((Path(p) for p in _SYSTEM_FILES if Path(p).is_file()), None)


@functools.cache
def cjk_face_index(path: Path) -> int:
    """Index of the Simplified Chinese face in a font collection (0 for a single font or a
    collection without one): its glyphs have the mainland forms."""
    if path.suffix.lower() != ".ttc":
        return 0
    from fontTools.ttLib import TTCollection

    with TTCollection(str(path), lazy=True) as collection:
        for i, face in enumerate(collection.fonts):
            name = face["name"].getDebugName(1) or ""
            if name.endswith(" SC") or "SC" in name.split():
                return i
    return 0


def use_cjk_font(*, quiet: bool = False) -> bool:
    """Let matplotlib draw CJK text: register the CJK font and append its family to
    ``rcParams["font.family"]`` (a fallback: Latin glyphs keep the first family). True when a
    CJK font is in place; else warns once with :data:`INSTALL_HINT` (unless `quiet`: the
    modules of `attnkit.viz` call it so when they load) and returns False."""
    import matplotlib as mpl
    from matplotlib import font_manager

    path = cjk_font_file()
    if path is None:
        if not quiet:
            _warn_missing()
        return False
    names = {f.name for f in font_manager.fontManager.ttflist if Path(f.fname) == path}
    if not names:
        font_manager.fontManager.addfont(str(path))
        names = {f.name for f in font_manager.fontManager.ttflist if Path(f.fname) == path}
    family = FAMILY if FAMILY in names else min(names, default=None)
    if family is None:
        if not quiet:
            _warn_missing()
        return False
    families = list(mpl.rcParams["font.family"])
    if family not in families:
        mpl.rcParams["font.family"] = [*families, family]
    return True


@functools.cache
def _warn_missing() -> None:
    warnings.warn(INSTALL_HINT, RuntimeWarning, stacklevel=3)


def css_subset(text: str) -> str | None:
    """An ``@font-face`` rule embedding the CJK font's glyphs of the characters of `text`
    (WOFF, base64; a few KB for a sentence), as family "attnkit CJK"; None when `text` has
    no CJK character or no CJK font is installed."""
    chars = sorted({c for c in text if has_cjk(c)})
    path = cjk_font_file()
    if not chars or path is None:
        return None
    from fontTools import subset
    from fontTools.ttLib import TTFont

    # lazy loading and no layout tables: 1.7 s instead of 4.7 s on a busy 2-core machine
    font = TTFont(str(path), fontNumber=cjk_face_index(path), lazy=True)
    options = subset.Options()
    options.flavor = "woff"  # zlib: no brotli needed
    options.layout_features = []  # no vertical forms or ligatures needed for labels
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6]  # keep the copyright and licence names
    subsetter = subset.Subsetter(options)
    subsetter.populate(text="".join(chars))
    subsetter.subset(font)
    out = io.BytesIO()
    font.flavor = "woff"
    font.save(out)
    data = base64.b64encode(out.getvalue()).decode("ascii")
    return (
        '@font-face { font-family: "attnkit CJK"; '
        f'src: url(data:font/woff;base64,{data}) format("woff"); }}'
    )
