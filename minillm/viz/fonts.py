"""A CJK-capable font for the course's matplotlib figures, found among the installed ones.

Chinese shows up in figures in both editions (token text on the sampling explorer's axes, the
Chinese edition's titles and legends), and matplotlib's default font (DejaVu Sans) has no
Chinese glyphs: every character would be drawn as an empty box, with a "Glyph ... missing
from font" warning. ``figure_fonts()`` puts a CJK font *after* the usual font in the font
list while a figure is built, so Latin text looks exactly as before and only the characters
DejaVu lacks fall back to it (matplotlib >= 3.6 falls back glyph by glyph).

No font is shipped: ``find_cjk_font`` looks in matplotlib's font list and, when its cache was
built before the font was installed, in the system's font folders. When none is found the
figures are still drawn (Chinese as boxes) and one warning says what to install.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

#: Font family names tried in order (simplified Chinese first).
CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK TC", "Source Han Sans SC",
                "Source Han Sans CN", "Source Han Sans", "Noto Sans SC", "PingFang SC", "Heiti SC",
                "Microsoft YaHei", "SimHei", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei",
                "Droid Sans Fallback", "AR PL UMing CN", "Noto Serif CJK SC", "Noto Serif CJK JP")
# File names of those fonts, to add them when matplotlib's font cache predates them.
_FILE_HINTS = ("notosanscjk", "notoserifcjk", "sourcehansans", "notosanssc", "pingfang", "msyh", "simhei",
               "wqy", "droidsansfallback", "uming")

_UNSET = object()
_found = _UNSET
_warned = False

MISSING_MESSAGE = ("minillm.viz: no CJK font found for matplotlib, so Chinese text in figures will show as "
                   "empty boxes. Install one, e.g. `sudo apt install fonts-noto-cjk` (Debian/Ubuntu), "
                   "`brew install --cask font-noto-sans-cjk-sc` (macOS) or any font with Chinese glyphs, "
                   "then restart the kernel.")


def _installed_families() -> set[str]:
    from matplotlib import font_manager

    return {f.name for f in font_manager.fontManager.ttflist}


def _first_known(names: set[str]) -> str | None:
    return next((f for f in CJK_FAMILIES if f in names), None)


def find_cjk_font(*, refresh: bool = False) -> str | None:
    """The family name of an installed CJK-capable font, or None. Looked up once per process."""
    global _found
    if _found is not _UNSET and not refresh:
        return _found
    from matplotlib import font_manager

    name = _first_known(_installed_families())
    if name is None:  # a cache built before the font was installed: add the font files directly
        for path in font_manager.findSystemFonts():
            base = path.replace("\\", "/").rsplit("/", 1)[-1].lower().replace("-", "").replace("_", "")
            if any(h in base for h in _FILE_HINTS):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):  # unreadable font file: try the next
                    continue
        name = _first_known(_installed_families())
    _found = name
    return name


def _warn_missing() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(MISSING_MESSAGE, UserWarning, stacklevel=3)


@contextlib.contextmanager
def figure_fonts():
    """While active, new matplotlib text falls back to a CJK font for the glyphs the usual font
    lacks. Without a CJK font it warns once and changes nothing."""
    import matplotlib

    cjk = find_cjk_font()
    if cjk is None:
        _warn_missing()
        yield None
        return
    family = list(matplotlib.rcParams["font.family"])
    if cjk not in family:
        family.append(cjk)
    with matplotlib.rc_context({"font.family": family}):
        yield cjk


def add_cjk_fallback(fig):
    """Give every text of an existing figure the CJK fallback font (for a figure, or axes
    passed in with ``ax=``, made outside ``figure_fonts()``). Returns the figure."""
    cjk = find_cjk_font()
    if cjk is None:
        _warn_missing()
        return fig
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        family = list(text.get_fontfamily())
        if cjk not in family:
            text.set_fontfamily(family + [cjk])
    return fig


def with_cjk_fonts(fn):
    """Decorator: build the figure inside ``figure_fonts()``, then make sure every text of the
    returned figure has the fallback (axes passed in were made before)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with figure_fonts() as cjk:
            fig = fn(*args, **kwargs)
        if cjk is not None and hasattr(fig, "findobj"):
            add_cjk_fallback(fig)
        return fig

    return wrapper
