"""``embodied demo``: every built part of the workspace, tiny, on embedded defaults -> one HTML page.

The foundation's sections (``embodied.sections``) run first, then every registered method's section
(``core.registry.DEMOS``, filled by the methods' ``register.py``). A section that fails is shown with its
error and makes the command exit non-zero; the others still run. The page is rewritten after every section.

``embodied demo`` writes into a hidden staged folder that is renamed onto ``--out`` when it ends
(``core.outputs.claim_output``). No path the user reads may name that folder: the page and summary link files
relative to the output folder, sections print ``ctx.display(path)``, and as a net for what the sections' own
commands say or record (``infer``'s lines, a warning naming its input, a training run's ``config.json``) the
runner shows the staged folder as the user's ``--out`` on the console while the sections run
(``final_paths_on_console``), and names the final folder in every text file once they are done
(``relocate_records``).
"""

from __future__ import annotations

import contextlib
import html
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
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


# ---------------------------------------------------------------------------------------------- final paths
def final_path_pairs(out: str | Path, final: str | Path, typed: str | Path | None = None) -> list[tuple[str, str]]:
    """``(staged, final)`` spellings to substitute, the longer first, for a run writing ``out`` that will be ``final``.

    The staged folder's absolute and symlink-resolved paths become ``final``'s (or ``typed``, the ``--out`` as the
    user typed it, for the console); when ``out`` is the hidden sibling ``.<name>.partial-<pid>`` that
    ``core.outputs.claim_output`` renames onto ``final``, its name alone becomes ``<name>`` too (a relative spelling
    of it then names the final folder as well).
    """
    out, final = Path(out), Path(final)
    shown = str(Path(typed)) if typed is not None else None
    pairs = {str(out.absolute()): shown or str(final.absolute()),
             str(out.resolve()): shown or str(final.absolute().parent.resolve() / final.name)}
    if out.absolute().parent == final.absolute().parent and \
            re.fullmatch(rf"\.{re.escape(final.name)}\.partial-\d+", out.name):
        pairs[out.name] = final.name
    return sorted(((k, v) for k, v in pairs.items() if k != v), key=lambda kv: len(kv[0]), reverse=True)


def _substitute(text: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        text = text.replace(old, new)
    return text


class _ShowFinal:
    """A text stream that writes each staged spelling as its final one and passes everything else through."""

    def __init__(self, stream, pairs: list[tuple[str, str]]):
        self._stream, self._pairs = stream, pairs

    def write(self, text: str) -> int:
        return self._stream.write(_substitute(text, self._pairs) if isinstance(text, str) else text)

    def __getattr__(self, name: str):  # flush, isatty, encoding, fileno ... of the real stream
        return getattr(self._stream, name)


@contextlib.contextmanager
def final_paths_on_console(out: str | Path, shown: str | Path | None) -> Iterator[None]:
    """Show the staged folder ``out`` as ``shown`` on the console while the block runs.

    stdout, stderr and log lines name ``shown`` (the ``--out`` the user typed), where the files will be once the
    run ends. Nothing changes when ``shown`` is None.
    """
    if shown is None:
        yield
        return
    pairs = final_path_pairs(out, shown, typed=shown)
    handlers = [h for name in ("embodied", None) for h in logging.getLogger(name).handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
                and not getattr(h.stream, "closed", False)]  # a handler left on a closed stream writes nothing
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ShowFinal(sys.stdout, pairs), _ShowFinal(sys.stderr, pairs)
    streams = [h.setStream(_ShowFinal(h.stream, pairs)) for h in handlers]
    try:
        yield
    finally:
        for h, stream in zip(handlers, streams, strict=True):
            h.setStream(stream)
        sys.stdout, sys.stderr = saved


#: Files that are not text, whatever bytes they hold (never edited).
BINARY_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".exr", ".hdr", ".mp4", ".gif", ".npy", ".npz", ".hdf5", ".h5",
                             ".safetensors", ".pt", ".pth", ".ckpt", ".bin", ".ply", ".pkl", ".parquet"})


def relocate_records(out: str | Path, final: str | Path) -> list[str]:
    """Name the final folder ``final`` instead of the staged ``out`` in every text file under ``out``.

    What a section's commands record names the folder they wrote into (a training run's ``config.json`` its
    ``out_dir``, its ``eval.json`` the checkpoint); inside the staged run that is ``out``, gone once it is renamed
    onto ``final``. Text files are rewritten atomically; binary files are never edited: those that still name
    ``out`` are returned (paths relative to ``out``) for the caller to report.
    """
    from core.io import write_text

    pairs = [(old.encode(), new.encode()) for old, new in final_path_pairs(out, final)]
    left = []
    for root, _dirs, files in os.walk(out):
        for name in files:
            path = Path(root) / name
            if path.is_symlink() or path.stat().st_size > 64 * 2**20:
                continue
            data = path.read_bytes()
            if not any(old in data for old, _ in pairs):
                continue
            text = None
            if path.suffix.lower() not in BINARY_SUFFIXES and b"\0" not in data:
                with contextlib.suppress(UnicodeDecodeError):
                    text = data.decode("utf-8")
            if text is None:
                left.append(path.relative_to(out).as_posix())
                continue
            write_text(path, _substitute(text, [(o.decode(), n.decode()) for o, n in pairs]))
    return sorted(left)


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
    """Run the sections (all, or those named in ``only``); returns 0 when every section ran.

    ``out`` is the folder to write (a staged one under ``embodied demo``), ``shown`` the folder as the user named
    it (``--out``), where ``out`` will be once the run ends: every path the user reads names that one.
    """
    from core.bootstrap import prepare_process
    from core.errors import ConfigError
    from core.registry import DEMOS, import_target, load_plugins

    prepare_process()  # learning stack before any render context (see core/bootstrap.py)
    load_plugins()
    given = Path(out)
    out = given.resolve()
    out.mkdir(parents=True, exist_ok=True)
    staged = shown is not None and Path(shown).absolute() != given.absolute()  # renamed onto shown at the end
    sections: list[tuple[str, Callable[[DemoContext], DemoSection]]] = [
        (n, (lambda t=t: import_target(t))) for n, t in FOUNDATION
    ] + [(n, (lambda n=n: DEMOS.get(n))) for n in DEMOS.names()]
    names = [n for n, _ in sections]
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(f"unknown demo section(s) {unknown}; known: {', '.join(names)}")
        sections = [s for s in sections if s[0] in only]
    ctx = DemoContext(out=out, seed=seed, shown=Path(shown) if staged else None)
    results: list[tuple[str, DemoSection | None, str | None, float]] = []
    summary: dict[str, Any] = {}
    with final_paths_on_console(given, shown if staged else None):
        _run_sections(ctx, sections, results, summary)
    write_json(out / "summary.json", summary)
    if staged:  # what the sections' commands recorded names the folder the user will find
        left = relocate_records(given, Path(shown))
        if left:
            log.warning("these files still name the staged folder (binary, not edited): %s", ", ".join(left))
    page = out / "index.html"
    failed = [n for n, s in summary.items() if not s["ok"]]
    print(f"demo: {len(results) - len(failed)}/{len(results)} sections ran -> {Path(shown or out) / page.name}")
    if failed:
        print(f"demo: failed sections: {', '.join(failed)}")
        return 1
    return 0


def _run_sections(ctx: DemoContext, sections: list[tuple[str, Callable[[], Callable[[DemoContext], DemoSection]]]],
                  results: list[tuple[str, DemoSection | None, str | None, float]], summary: dict[str, Any]) -> None:
    from core.logging import progress

    out = ctx.out
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
