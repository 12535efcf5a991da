"""Reports of a closed-loop driving run: the markdown table, the self-contained HTML page and video overlays.

``write_reports(out, report)`` writes ``summary.md`` (scenario x DS, SR, collision / off-road / timeout /
failure rates, progress, route completion, comfort, jerk, lateral acceleration, mean speed, NAVSIM's PDMS /
EPDMS, Bench2Drive's efficiency / comfortness, policy latency; scores and rates in %, see ``PERCENT``; then
Bench2Drive's per-ability success) and
``index.html`` (that table, the per-episode rows of every scenario, and ``<video>`` tags of the recorded
episodes with paths relative to the run folder, so the folder can be moved or served as is).

Overlays (``draw_overlay``): a policy may expose ``overlay() -> {"waypoints": (n, 2) ego-frame metres,
"meta_action": str} | None``, read after each ``act``; the waypoints are projected into the front camera
with the camera model of ``sim.driving.render.SceneRasterizer`` (pinhole, 1.5 m above the ground at
x = +1 m, pitched down 3 degrees, horizontal field of view 90 degrees) and drawn as a polyline with dots,
the meta-action as text in the top-left corner.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.io import write_text

# Units: the driving score, the success rate, route completion and the episode rates are shown in % wherever
# a person reads them (this table, summary.md, index.html, `embodied drive eval` / `embodied eval automot`
# output and the READMEs), as Bench2Drive reports them; the JSON records (summary.json, metrics.json,
# episodes.jsonl, eval.json) keep them as fractions in [0, 1] under the same keys. PERCENT scales one to the other.
PERCENT = 100.0
# (column title, aggregate key, format, display scale)
SUMMARY_COLUMNS: tuple[tuple[str, str, str, float], ...] = (
    ("episodes", "episodes", "{:d}", 1),
    ("DS %", "driving_score", "{:.1f}", PERCENT),
    ("SR %", "success_rate", "{:.0f}", PERCENT),
    ("collision %", "collision_rate", "{:.0f}", PERCENT),
    ("off-road %", "offroad_rate", "{:.0f}", PERCENT),
    ("timeout %", "timeout_rate", "{:.0f}", PERCENT),
    ("failed %", "failure_rate", "{:.0f}", PERCENT),
    ("progress m", "progress_m", "{:.1f}", 1),
    ("route compl. %", "route_completion", "{:.1f}", PERCENT),
    ("comfort %", "comfort_rate", "{:.0f}", PERCENT),
    ("|jerk| m/s3", "mean_abs_jerk_mps3", "{:.2f}", 1),
    ("|lat acc| m/s2", "mean_abs_lat_acc_mps2", "{:.2f}", 1),
    ("speed m/s", "mean_speed_mps", "{:.1f}", 1),
    ("PDMS %", "pdms", "{:.1f}", PERCENT),
    ("EPDMS %", "epdms", "{:.1f}", PERCENT),
    ("efficiency %", "efficiency", "{:.0f}", PERCENT),
    ("comfortness %", "comfortness", "{:.0f}", PERCENT),
    ("latency p50 ms", "latency_ms_p50", "{:.1f}", 1),
    ("p99 ms", "latency_ms_p99", "{:.1f}", 1),
)
#: The columns ``embodied drive eval`` prints, to set beside Bench2Drive's (DS, SR, efficiency, comfortness) and
#: NAVSIM's (PDMS, EPDMS) tables; the rest are in summary.md / index.html, every figure in summary.json.
STDOUT_COLUMNS = ("episodes", "DS %", "SR %", "PDMS %", "EPDMS %", "efficiency %", "comfortness %", "collision %",
                  "route compl. %", "latency p50 ms", "p99 ms")
EPISODE_COLUMNS: tuple[str, ...] = (
    "episode", "seed", "driving_score", "success", "pdms", "epdms", "pdm_nc", "pdm_dac", "pdm_ddc", "pdm_ttc",
    "pdm_ep", "pdm_c", "pdm_lk", "efficiency", "comfortness", "route_completion", "progress_m",
    "collisions_vehicle", "collisions_static", "offroad_events", "timed_out", "mean_speed_mps",
    "max_abs_jerk_mps3", "max_abs_lat_acc_mps2", "latency_ms_p50", "steps", "failure",
)


def _fmt(fmt: str, value: Any, scale: float = 1) -> str:
    try:
        return fmt.format(value * scale if scale != 1 else value)
    except (ValueError, TypeError):
        return str(value)


def summary_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """One row of formatted cells per scenario, then ``overall`` (when there is more than one scenario)."""
    rows = []
    scenarios = report["scenarios"]

    def cells(aggregate: Mapping[str, Any], latency: Mapping[str, Any] | None) -> list[str]:
        values = {**aggregate, **(latency or {})}
        return [_fmt(f, values[k], x) if values.get(k) is not None else "—" for _, k, f, x in SUMMARY_COLUMNS]

    for name, sc in scenarios.items():
        rows.append([name] + cells(sc["aggregate"], sc.get("latency")))
    if len(scenarios) > 1:
        rows.append(["overall"] + cells(report["aggregate"], report.get("latency")))
    return rows


def ability_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """Bench2Drive's multi-ability table: ability, the scenarios that exercise it, episodes, success %."""
    rows = []
    for name, a in (report.get("abilities") or {}).items():
        if a.get("scenarios"):
            sr = "—" if a.get("success_rate") is None else f"{PERCENT * a['success_rate']:.0f}"
            rows.append([name, ", ".join(a["scenarios"]), str(a.get("episodes", 0)), sr, ""])
        else:
            rows.append([name, "—", "0", "—", f"not expressible: {a['reason']}"])
    return rows


ABILITY_HEAD = ["ability (Bench2Drive)", "scenarios", "episodes", "SR %", "note"]


def _aligned(table: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    width = [max(len(row[j]) for row in table) for j in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) if j in left else c.rjust(w) for j, (c, w) in enumerate(zip(row, width, strict=True)))
             .rstrip() for row in table]
    return "\n".join([lines[0], "  ".join("-" * w for w in width), *lines[1:]])


def stdout_table(report: Mapping[str, Any]) -> str:
    """The aligned plain-text table ``embodied drive eval`` prints: scenario x ``STDOUT_COLUMNS``."""
    titles = ["scenario"] + [c for c, _, _, _ in SUMMARY_COLUMNS]
    keep = [0] + [i for i, t in enumerate(titles) if t in STDOUT_COLUMNS]
    table = [[titles[i] for i in keep]] + [[r[i] for i in keep] for r in summary_rows(report)]
    text = _aligned(table)
    abilities = ability_rows(report)
    if abilities:
        text += "\n\n" + _aligned([ABILITY_HEAD, *abilities], left=(0, 1, 4))
    return text


def markdown_summary(report: Mapping[str, Any]) -> str:
    """``summary.md``: a title line and the scenario x metrics table."""
    head = ["scenario"] + [c for c, _, _, _ in SUMMARY_COLUMNS]
    lines = [
        f"# Closed-loop driving: policy `{report['policy']}`",
        "",
        f"Seeds {report['seed']}..{report['seed'] + report['n_episodes'] - 1} (episode j uses seed + j in every "
        f"scenario); policy args: {report.get('policy_args') or '{}'}.",
        "DS = mean(route completion x infraction penalties), SR = share of episodes completed with no "
        "infraction; rates are shares of episodes; failed = the policy raised / returned an invalid action "
        "(scored 0). DS, SR, route completion and the rates in % (summary.json: the same as fractions).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in summary_rows(report)]
    lines += ["", PDM_NOTE + _not_computable(report), ""]
    abilities = ability_rows(report)
    if abilities:
        lines += ["| " + " | ".join(ABILITY_HEAD) + " |", "|" + "|".join("---" for _ in ABILITY_HEAD) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in abilities]
    return "\n".join(lines) + "\n"


PDM_NOTE = ("PDMS / EPDMS: NAVSIM v1 / v2 scores of each 4 s scene, then averaged over scenes (sim/driving/pdm.py "
            "defines every sub-score); efficiency: the ego's speed over the surrounding traffic's (Bench2Drive); "
            "comfortness: share of comfortable 1 s segments; latency: the policy's time per step (p50 / p99).")


def _not_computable(report: Mapping[str, Any]) -> str:
    items = report.get("not_computable") or {}
    return (" Not computable here (counted 1): " + "; ".join(f"{k.upper()}: {v}" for k, v in items.items()) + "."
            if items else "")


def _html_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


_CSS = ("body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;"
        "margin:8px 0 16px}th,td{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:right}"
        "th{background:#f0f0f0}td:first-child{text-align:left}figure{display:inline-block;margin:4px}"
        "figcaption{font-size:12px;color:#555}.fail{color:#b00}")


def html_page(report: Mapping[str, Any]) -> str:
    """``index.html``: a self-contained page (inline CSS, videos by relative path)."""
    title = f"Closed-loop driving: {report['policy']}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>Seeds {report['seed']}..{report['seed'] + report['n_episodes'] - 1} (episode j uses seed + j in every "
             f"scenario); policy args: <code>{html.escape(str(report.get('policy_args') or {}))}</code>. "
             "DS = mean(route completion x infraction penalties: vehicle 0.6, static 0.65, off-road 0.7, "
             "timeout 0.7); SR = share completed with no infraction; failed episodes score 0. DS, SR, route "
             "completion and the rates in % (summary.json: the same as fractions in [0, 1]).</p>",
             _html_table(["scenario"] + [c for c, _, _, _ in SUMMARY_COLUMNS], summary_rows(report)),
             f"<p>{html.escape(PDM_NOTE + _not_computable(report))}</p>"]
    if ability_rows(report):
        parts.append(_html_table(ABILITY_HEAD, ability_rows(report)))
    for name, sc in report["scenarios"].items():
        parts.append(f"<h2>{html.escape(name)} <small>({html.escape(sc['env_id'])})</small></h2>")
        rows = [[_cell(r.get(c)) for c in EPISODE_COLUMNS] for r in sc["episodes"]]
        parts.append(_html_table(EPISODE_COLUMNS, rows))
        for v in sc.get("videos", []):
            cap = f"{name} episode {v['episode']} (seed {v['seed']}), DS {PERCENT * v['driving_score']:.1f} %"
            row = next((r for r in sc["episodes"] if r.get("episode") == v["episode"]), {})
            if row.get("pdms") is not None:
                cap += (f", PDMS {PERCENT * row['pdms']:.1f} %, EPDMS {PERCENT * row['epdms']:.1f} % (NC "
                        f"{row.get('pdm_nc', 1):.2f}, DAC {row.get('pdm_dac', 1):.2f}, TTC {row.get('pdm_ttc', 1):.2f}, "
                        f"EP {row.get('pdm_ep', 1):.2f}, C {row.get('pdm_c', 1):.2f})")
            if v.get("failure"):
                cap += f" — failed: {v['failure']}"
            parts.append(f'<figure><video src="{html.escape(v["path"])}" width="384" controls loop muted '
                         f'playsinline></video><figcaption>{html.escape(cap)}</figcaption></figure>')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_reports(out: str | Path, report: Mapping[str, Any]) -> None:
    """Write ``summary.md`` and ``index.html`` into ``out`` (atomically)."""
    out = Path(out)
    write_text(out / "summary.md", markdown_summary(report))
    write_text(out / "index.html", html_page(report))


# --------------------------------------------------------------------------------------------- overlays
def project_ego_points(points: np.ndarray, image_size: tuple[int, int], hfov_deg: float | None = None) -> np.ndarray:
    """Ego-frame ground points (n, 2) [m] -> (n, 2) float pixel (u, v) in the front camera; NaN where a
    point lies behind the near plane. Camera model of ``sim.driving.render.SceneRasterizer``."""
    import inspect

    from sim.driving.render import SceneRasterizer as R

    if hfov_deg is None:
        hfov_deg = inspect.signature(R).parameters["hfov_deg"].default
    h, w = image_size
    fx = (w / 2) / np.tan(np.deg2rad(hfov_deg) / 2)
    p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    x = -p[:, 1]
    y = np.full(len(p), R.CAM_Z)
    zf = p[:, 0] - R.CAM_X
    c, s = np.cos(R.CAM_PITCH), np.sin(R.CAM_PITCH)
    yc, zc = y * c - zf * s, y * s + zf * c
    uv = np.stack([fx * x / np.maximum(zc, 1e-6) + w / 2, fx * yc / np.maximum(zc, 1e-6) + h / 2], -1)
    uv[zc < R.NEAR] = np.nan
    return uv


def sanitize_overlay(overlay: Any) -> dict[str, Any] | None:
    """A policy's ``overlay()`` result as ``{"waypoints": (n, 2) float array | None, "meta_action": str}``."""
    if not isinstance(overlay, Mapping):
        return None
    wp = overlay.get("waypoints")
    if wp is not None:
        try:
            wp = np.asarray(wp, dtype=np.float64).reshape(-1, 2)
        except (ValueError, TypeError):
            wp = None
    meta = overlay.get("meta_action")
    return {"waypoints": wp, "meta_action": "" if meta is None else str(meta)}


def draw_overlay(frame: np.ndarray, overlay: Mapping[str, Any] | None, scale: int = 1,
                 footer: str = "") -> np.ndarray:
    """The frame (H, W, 3) uint8, upscaled ``scale`` times, with the overlay's waypoints and meta-action."""
    import cv2

    img = np.ascontiguousarray(frame)
    if scale > 1:
        img = cv2.resize(img, (img.shape[1] * scale, img.shape[0] * scale), interpolation=cv2.INTER_NEAREST)
    img = img.copy()
    font, fs = cv2.FONT_HERSHEY_SIMPLEX, 0.35 * scale
    if overlay:
        wp = overlay.get("waypoints")
        if wp is not None and len(wp):
            uv = project_ego_points(np.concatenate([[[0.0, 0.0]], wp]), frame.shape[:2]) * scale
            pts = uv[np.isfinite(uv).all(axis=1)]
            pts = np.clip(pts, -1e4, 1e4)
            if len(pts) >= 2:
                cv2.polylines(img, [np.round(pts * 8).astype(np.int32)], False, (255, 40, 200), max(scale, 1),
                              cv2.LINE_AA, 3)
            for u, v in pts[1:]:
                cv2.circle(img, (int(round(u * 8)), int(round(v * 8))), 2 * scale * 8, (255, 230, 0), -1,
                           cv2.LINE_AA, 3)
        if overlay.get("meta_action"):
            org = (4 * scale, 12 * scale)
            cv2.putText(img, overlay["meta_action"], org, font, fs, (0, 0, 0), 2 * scale, cv2.LINE_AA)
            cv2.putText(img, overlay["meta_action"], org, font, fs, (255, 255, 255), max(scale // 2, 1), cv2.LINE_AA)
    if footer:
        org = (4 * scale, img.shape[0] - 5 * scale)
        cv2.putText(img, footer[:60], org, font, fs, (0, 0, 0), 2 * scale, cv2.LINE_AA)
        cv2.putText(img, footer[:60], org, font, fs, (255, 80, 80), max(scale // 2, 1), cv2.LINE_AA)
    return img


def overlay_frames(frames: np.ndarray, overlays: Sequence[Mapping[str, Any] | None] | None,
                   failure: str | None = None) -> np.ndarray:
    """(T + 1, H, W, 3) frames of an episode with the per-step overlays drawn (frame t with the overlay the
    policy produced when acting on it; the last frame without). Small frames are upscaled 2x (legible text);
    a failed episode's last frame carries its reason."""
    frames = np.asarray(frames)
    scale = 2 if frames.shape[1] < 160 else 1
    out = []
    for t, f in enumerate(frames):
        ov = overlays[t] if overlays is not None and t < len(overlays) else None
        footer = f"FAILED: {failure}" if failure and t == len(frames) - 1 else ""
        out.append(draw_overlay(f, ov, scale, footer))
    return np.stack(out)
