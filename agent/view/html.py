"""HTML built safely by construction: text is escaped unless it is ``Html`` this module made.

Runs in the viewer's process. Every string from a record (a model's text, an observation, a file name) is
plain ``str`` and goes through ``html.escape`` where it lands; only ``el`` and ``raw`` (given constants of
this package) make ``Html``. Attribute names are the code's own; their values are escaped with quotes.
"""

from __future__ import annotations

import html

_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "source", "col", "wbr"})
_SVG = frozenset({"svg", "rect", "line", "text", "g", "title", "path", "circle", "polyline"})


class Html(str):
    """Markup this package built; everything else is text."""


def raw(markup: str) -> Html:
    """``markup`` trusted as is: the code's own constants only, never a record's text."""
    return Html(markup)


def clean(value: str) -> str:
    """``value`` encodable as UTF-8: a name's undecodable bytes (``os.fsdecode``'s surrogates) as ``\\xff``,
    any other lone surrogate (a model's JSON may hold one) as U+FFFD."""
    try:
        value.encode()
        return value
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode()


def text(value: object) -> Html:
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("")
    if isinstance(value, str | int | float):
        return Html(html.escape(clean(str(value)), quote=True))
    return Html("".join(text(v) for v in value))  # type: ignore[attr-defined]


def el(tag: str, *children: object, **attrs: object) -> Html:
    """``<tag attrs>children</tag>``; ``class_`` is ``class``, ``_`` in other names is ``-``, a None or False
    value leaves the attribute out, True writes it bare."""
    parts = [tag]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        key = "class" if name == "class_" else name.rstrip("_").replace("_", "-")
        if tag in _SVG and key in ("view-box", "text-anchor", "font-size", "stroke-width", "dominant-baseline"):
            key = {"view-box": "viewBox"}.get(key, key)
        parts.append(key if value is True else f'{key}="{html.escape(clean(str(value)), quote=True)}"')
    opening = "<" + " ".join(parts) + ">"
    if tag in _VOID:
        return Html(opening)
    return Html(opening + text(children) + f"</{tag}>")
