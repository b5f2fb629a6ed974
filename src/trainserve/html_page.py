"""The pieces of a self-contained HTML report (eval, replay, drift): one style, tables, and PNG figures inlined as
`data:` URIs, so the page opens from a file, a CI artifact or a mail attachment with nothing beside it."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from html import escape

__all__ = ["escape", "figure", "figure_of", "fmt", "page", "png_uri", "table", "verdict"]

STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.35em;padding:.6em .8em;border-radius:6px}.pass{background:#e3f4e1}.fail{background:#fbe3e1}
.none{background:#fff3cd}table{border-collapse:collapse;margin:.6em 0 1.4em}td,th{border:1px solid #ccc;
padding:.25em .6em;text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
img{max-width:100%;height:auto}.side{display:flex;gap:1em;flex-wrap:wrap}.side figure{flex:1;min-width:300px;margin:0}
code{background:#f3f3f3;padding:0 .25em}"""


def page(title: str, body: list[str], footer: str, script: str = "") -> str:
    """A whole page: `body` is HTML already escaped by the helpers below; `script` runs in its head."""
    script = f"<script>{script}</script>" if script else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style>{script}</head><body>{''.join(body)}<p><small>{escape(footer)}</small></p>"
        "</body></html>\n"
    )


def verdict(passed: bool | None, said: str) -> str:
    state = "none" if passed is None else "pass" if passed else "fail"
    return f'<h1 class="{state}" id="verdict">{escape(said)}</h1>'


def table(header: list[str], rows: list[list], caption: str = "", ident: str = "", floats: str = ".4g") -> str:
    """`floats`: how numbers are written (eval's metrics: `.4f`, four decimals as its summary prints them)."""
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    cells = "".join("<tr>" + "".join(f"<td>{escape(fmt(c, floats))}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    idattr = f' id="{escape(ident)}"' if ident else ""
    return f"<table{idattr}>{cap}<thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>"


def fmt(value, floats: str = ".4g") -> str:
    if isinstance(value, float):
        return format(value, floats)
    return "n/a" if value is None else str(value)


def png_uri(draw: Callable) -> str:
    """`draw(out)` writes a PNG to the file-like `out`; returned as a `data:` URI."""
    buffer = io.BytesIO()
    draw(buffer)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def figure(draw: Callable, caption: str, ident: str) -> str:
    """The PNG `draw(out)` writes, inline, with its caption."""
    return figure_of(png_uri(draw), caption, ident)


def figure_of(uri: str, caption: str, ident: str) -> str:
    said = escape(caption)
    return f'<figure><img id="{escape(ident)}" src="{uri}" alt="{said}"><figcaption>{said}</figcaption></figure>'
