"""``embodied demo``: every built part of the workspace, tiny, on embedded defaults -> one HTML page.

The foundation's sections (``embodied.sections``) run first, then every registered method's section
(``core.registry.DEMOS``, filled by the methods' ``register.py``). A section that fails is shown with its
error and makes the command exit non-zero; the others still run. The page is rewritten after every section.
"""

from __future__ import annotations

import html
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.demo import DemoContext, DemoSection
from core.io import write_json, write_text
from core.logging import get_logger

log = get_logger("embodied.demo")

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
    ("methods", "embodied.sections:methods_section"),
    ("simulators", "embodied.sections:simulators_section"),
    ("datasets", "embodied.sections:datasets_section"),
    ("loaders", "embodied.sections:loaders_section"),
]


def check_sections(only: list[str] | None) -> None:
    """A one-line ``ConfigError`` when ``only`` names a section that does not exist."""
    from core.errors import ConfigError
    from core.registry import DEMOS, load_plugins

    load_plugins()
    names = [n for n, _ in FOUNDATION] + DEMOS.names()
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise ConfigError(f"unknown demo section(s) {unknown}; known: {', '.join(names)}")


def run_demo(out: str | Path, only: list[str] | None = None, seed: int = 0, shown: str | Path | None = None) -> int:
    """Run the sections (all, or those named in ``only``); returns 0 when every section ran."""
    from core.bootstrap import prepare_process
    from core.errors import ConfigError
    from core.registry import DEMOS, import_target, load_plugins

    prepare_process()  # learning stack before any render context (see core/bootstrap.py)
    load_plugins()
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
    from core.logging import progress

    bar = progress(total=len(sections), desc="demo", unit="section")
    for name, loader in sections:
        t0 = time.perf_counter()
        bar.set_postfix_str(name)
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
        bar.update()
    bar.close()
    write_json(out / "summary.json", summary)
    page = out / "index.html"
    failed = [n for n, s in summary.items() if not s["ok"]]
    print(f"demo: {len(results) - len(failed)}/{len(results)} sections ran -> {Path(shown or out) / page.name}")
    if failed:
        print(f"demo: failed sections: {', '.join(failed)}")
        return 1
    return 0
