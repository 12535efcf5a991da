"""The demo-section contract: what a method's ``demo.py`` returns for the ``embodied demo`` page.

A section is ``fn(ctx: DemoContext) -> DemoSection``, registered by its method
(``core.registry.register_method(demo="pkg.demo:demo_section")``); the runner and the page live in the app
layer (``embodied/demo.py``). Sections share the context: later ones use what earlier ones made
(``ctx.artifacts``: the recorded rollouts feed the loaders and the BC policy).
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

    def path(self, *parts: str) -> Path:
        """``out / parts...``, its parent folder created."""
        p = self.out.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def rel(self, p: str | Path) -> str:
        """``p`` relative to the output folder (how the page links it)."""
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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)
