"""``embodied demo``: every built part of the workspace, tiny, on embedded defaults -> one HTML page.

Sections run in order and share a context (later sections use what earlier ones made: the recorded
rollouts feed the loaders and the BC policy). A section that fails is shown with its error and makes
the command exit non-zero; the others still run. Method sections are registered in ``DEMOS`` (lazy
``"module:function"`` strings), so a new method adds its section without touching this file.

A section is ``fn(ctx: DemoContext) -> DemoSection``.
"""

from __future__ import annotations

import html
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.io import write_json, write_text
from core.logging import get_logger
from core.registry import Registry

log = get_logger("embodied.demo")

DEMOS = Registry("demo section")


@dataclass
class DemoSection:
    """What a section shows: a title, a lead paragraph, HTML body, key figures."""

    title: str
    lead: str = ""
    body: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class DemoContext:
    """Shared by the sections: the output folder and what earlier sections produced (``artifacts``)."""

    out: Path
    seed: int = 0
    artifacts: dict[str, Any] = field(default_factory=dict)

    def path(self, *parts: str) -> Path:
        p = self.out.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def rel(self, p: str | Path) -> str:
        return str(Path(p).resolve().relative_to(self.out.resolve()))

    def save_image(self, name: str, img: np.ndarray, scale: int = 1) -> str:
        """Write (H, W, 3) uint8 RGB (or (H, W) grey) as PNG under ``img/``; returns the relative path."""
        import cv2

        from core.io import atomic_path

        if scale > 1:
            img = np.repeat(np.repeat(img, scale, axis=0), scale, axis=1)
        p = self.path("img", name)
        with atomic_path(p) as tmp:
            arr = img[..., ::-1] if img.ndim == 3 else img
            if not cv2.imwrite(str(tmp), np.ascontiguousarray(arr)):
                raise OSError(f"could not write {p}")
        return self.rel(p)


# ---------------------------------------------------------------------------------------------- HTML
def img_tag(src: str, caption: str = "", width: int = 160) -> str:
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{html.escape(src)}" width="{width}" style="image-rendering:pixelated">{cap}</figure>'


def video_tag(src: str, caption: str = "", width: int = 256) -> str:
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return (f'<figure><video src="{html.escape(src)}" width="{width}" controls loop muted autoplay playsinline>'
            f"</video>{cap}</figure>")


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:.25em .6em;font-size:.9em}
th{background:#f4f4f4} figure{display:inline-block;margin:.3em;text-align:center;vertical-align:top}
figcaption{font-size:.8em;color:#555} .ok{color:#1a7f37} .fail{color:#cf222e} pre{background:#f6f8fa;padding:.6em;
overflow-x:auto;font-size:.8em} .lead{color:#444}
"""


def render_page(out: Path, results: list[tuple[str, DemoSection | None, str | None, float]]) -> Path:
    """Write ``out/index.html`` (atomically) from the sections' results."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>embodied demo</title><style>{_CSS}</style>"
             "</head><body><h1>Embodied-AI workspace — demo</h1>",
             f"<p class='lead'>Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by <code>embodied demo</code>. "
             "Every part runs tiny, on CPU, on embedded defaults; the numbers show that each part works, "
             "not what it reaches at scale.</p><ul>"]
    for name, sec, err, secs in results:
        status = "<span class='fail'>failed</span>" if err else f"<span class='ok'>ok</span> ({secs:.0f} s)"
        title = sec.title if sec else name
        parts.append(f"<li><a href='#{name}'>{html.escape(title)}</a> — {status}</li>")
    parts.append("</ul>")
    for name, sec, err, _secs in results:
        parts.append(f"<h2 id='{name}'>{html.escape(sec.title if sec else name)}</h2>")
        if sec is not None:
            if sec.lead:
                parts.append(f"<p class='lead'>{sec.lead}</p>")
            parts.append(sec.body)
        if err:
            parts.append(f"<p class='fail'>This section failed:</p><pre>{html.escape(err)}</pre>")
    parts.append("</body></html>")
    path = out / "index.html"
    write_text(path, "\n".join(parts))
    return path


# ---------------------------------------------------------------------------------------------- runner
FOUNDATION: list[tuple[str, str]] = [
    ("methods", "core.demo_sections:methods_section"),
    ("simulators", "core.demo_sections:simulators_section"),
    ("datasets", "core.demo_sections:datasets_section"),
    ("loaders", "core.demo_sections:loaders_section"),
]
DEMOS.register("driving", "driving.demo:demo_section")
DEMOS.register("sola", "perception.spherical.demo:demo_section")
DEMOS.register("transnormal", "perception.normals.demo:demo_section")
DEMOS.register("lacwm", "worldmodels.lacwm.demo:demo_section")
DEMOS.register("bc", "worldmodels.bc.demo:demo_section")


def run_demo(out: str | Path, only: list[str] | None = None, seed: int = 0) -> int:
    """Run the sections (all, or those named in ``only``); returns 0 when every section ran."""
    from core.bootstrap import prepare_process
    from core.errors import ConfigError
    from core.registry import import_target

    prepare_process()  # learning stack before any render context (see core/bootstrap.py)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[str, Callable[[DemoContext], DemoSection]]] = [
        (n, (lambda t=t: import_target(t))) for n, t in FOUNDATION
    ] + [(n, (lambda n=n: DEMOS.get(n))) for n in DEMOS.names()]
    names = [n for n, _ in sections]
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"unknown demo section(s) {unknown}; known: {', '.join(names)}")
        sections = [s for s in sections if s[0] in only]
    ctx = DemoContext(out=out, seed=seed)
    results: list[tuple[str, DemoSection | None, str | None, float]] = []
    summary: dict[str, Any] = {}
    for name, loader in sections:
        t0 = time.perf_counter()
        log.info("demo section %s ...", name)
        try:
            sec = loader()(ctx)
            err = None
        except Exception as e:  # a broken section is reported on the page, the rest still run
            sec, err = None, f"{type(e).__name__}: {e}\n\n{traceback.format_exc(limit=6)}"
            log.error("demo section %s failed: %s", name, e)
        secs = time.perf_counter() - t0
        results.append((name, sec, err, secs))
        summary[name] = {"ok": err is None, "seconds": round(secs, 1), "figures": sec.figures if sec else {},
                         "error": err.splitlines()[0] if err else None}
        render_page(out, results)  # the page is complete after every section
    write_json(out / "summary.json", summary)
    page = out / "index.html"
    failed = [n for n, s in summary.items() if not s["ok"]]
    print(f"demo: {len(results) - len(failed)}/{len(results)} sections ran -> {page}")
    if failed:
        print(f"demo: failed sections: {', '.join(failed)}")
        return 1
    return 0
