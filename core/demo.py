"""The demo-section contract: what a method's ``demo.py`` returns for the ``embodied demo`` page.

A section is ``fn(ctx: DemoContext) -> DemoSection``, registered by its method
(``core.registry.register_method(demo="pkg.demo:demo_section")``); the runner and the page live in the app
layer (``embodied/demo.py``). Sections share the context: later ones use what earlier ones made
(``ctx.artifacts``: the recorded rollouts feed the loaders and the BC policy).

Two rules for what a section shows:

- Paths: ``ctx.out`` may be a hidden staged folder that is renamed onto the user's ``--out`` when the run ends
  (``core.outputs.claim_output``); the page links files relative to it (``ctx.rel``) and a path printed for the
  user is ``ctx.display(p)``, the path the file will have once the run is over.
- Words: a sentence that compares numbers ("about the same", "better") is chosen from the measured numbers
  beside it, with a stated tolerance (``verdict``, ``compare_clause``), never written ahead of the measurement.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


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
    #: The folder as the user named it (``--out``), where ``out`` lands when the run ends; None: ``out`` itself.
    shown: Path | None = None

    def path(self, *parts: str) -> Path:
        """``out / parts...``, its parent folder created."""
        p = self.out.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def rel(self, p: str | Path) -> str:
        """``p`` relative to the output folder (how the page links it)."""
        return str(Path(p).resolve().relative_to(self.out.resolve()))

    def display(self, p: str | Path) -> str:
        """``p`` (under ``out``) as the user will find it: under the folder they named, not the staged one."""
        return str(Path(self.shown) / self.rel(p)) if self.shown is not None else str(p)

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
    """An HTML ``<figure>`` showing the image ``src`` (pixelated when scaled up) with an optional caption."""
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{html.escape(src)}" width="{width}" style="image-rendering:pixelated">{cap}</figure>'


def video_tag(src: str, caption: str = "", width: int = 256) -> str:
    """An HTML ``<figure>`` playing the video ``src`` (looped, muted, autoplay) with an optional caption."""
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return (f'<figure><video src="{html.escape(src)}" width="{width}" controls loop muted autoplay playsinline>'
            f"</video>{cap}</figure>")


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """An HTML table of ``rows`` (dicts), one column per name in ``columns`` (default: the first row's keys)."""
    if not rows:
        return "<p><em>none</em></p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# ---------------------------------------------------------------------------------------------- words from numbers
SAME, BETTER, WORSE, UNKNOWN = "about the same", "better", "worse", "not comparable"


def relative_change(value: float, ref: float) -> float:
    """``(value - ref) / |ref|``; nan when either is not a finite number or ``ref`` is 0."""
    try:
        value, ref = float(value), float(ref)
    except (TypeError, ValueError):
        return float("nan")
    if not (np.isfinite(value) and np.isfinite(ref)) or ref == 0:
        return float("nan")
    return (value - ref) / abs(ref)


def verdict(value: float, ref: float, tolerance: float, higher_is_better: bool = True) -> str:
    """How ``value`` compares with ``ref`` in words, the tolerance stated by the caller.

    ``SAME`` when ``value`` is within ``tolerance`` (relative, e.g. 0.05) of ``ref``, else ``BETTER`` or ``WORSE``
    by the metric's direction; ``UNKNOWN`` when the two cannot be compared (nan, a zero reference).
    """
    change = relative_change(value, ref)
    if change != change:
        return UNKNOWN
    if abs(change) <= tolerance:
        return SAME
    return BETTER if (change > 0) == higher_is_better else WORSE


def percent_change(value: float, ref: float) -> str:
    """The relative change as people read it: ``+60 %``, ``-32 %``, ``+0.4 %`` (``n/a`` when not comparable)."""
    change = relative_change(value, ref)
    if change != change:
        return "n/a"
    x = 100 * change
    return f"{x:+.0f} %" if abs(x) >= 9.5 else f"{x:+.1f} %"


def compare_clause(metric: str, value: float, ref: float, ref_label: str, fmt: str = "{:.3f}", unit: str = "") -> str:
    """``"MAE 0.289 m vs 0.180 m upright (+60 %)"``: both measured numbers and their relative change."""
    u = f" {unit}" if unit else ""
    return f"{metric} {fmt.format(value)}{u} vs {fmt.format(ref)}{u} {ref_label} ({percent_change(value, ref)})"


def join_words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (empty items left out)."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)
