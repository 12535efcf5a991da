"""``embodied models``: the shipped checkpoints and a user's folder of models, with their cards' fields, read-only."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from core.checkpoint import save_checkpoint
from core.pretrained import PreTrainedModel, read_card
from core.testing import folder_digest
from embodied.models import find_models, format_rows, list_models

REPO = Path(__file__).resolve().parents[2]
EMBODIED = str(Path(sys.executable).with_name("embodied"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@dataclasses.dataclass
class _Cfg:
    width: int = 8
    base_path: str = ""


class _Listed(PreTrainedModel):
    config_class = _Cfg
    method = "listed"

    def __init__(self, config: _Cfg):
        super().__init__()
        self.config = config
        self.net = nn.Linear(config.width, 3)


def _users_folder(tmp_path: Path) -> Path:
    """A user's folder: an export with a card, a training run (two checkpoints, no card), notes, a broken model."""
    user = tmp_path / "mine"
    torch.manual_seed(0)
    _Listed(_Cfg(width=8)).save_pretrained(user / "exports" / "good", card={
        "data": "my robot's demos", "training_domain": "my lab", "metrics": {"success": 0.75, "split": {"n": 40}}})
    run = user / "runs" / "r1"
    model = _Listed(_Cfg(width=5))
    for step in (10, 20):
        save_checkpoint(run / "checkpoints" / f"step_{step}", model, config={"method": "listed", "model": {
            "width": 5, "base_path": "/data/base"}})
    from core.checkpoint import mark_latest

    mark_latest(run / "checkpoints", "step_20")
    broken = user / "exports" / "broken"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"")
    (user / "notes.txt").write_text("mine")
    return user


def test_rows_carry_the_card_fields_and_fall_back_to_config_and_header(tmp_path):
    user = _users_folder(tmp_path)
    rows = {r["name"]: r for r in list_models([user], shipped=False)}
    assert sorted(rows) == ["exports/broken", "exports/good", "runs/r1"]
    good = rows["exports/good"]
    assert good["error"] is None and good["method"] == "listed" and good["parameters"] == 8 * 3 + 3
    assert good["metrics"] == {"success": 0.75, "split": {"n": 40}} and good["data"] == "my robot's demos"
    assert good["training_domain"] == "my lab" and good["base"] is None
    run = rows["runs/r1"]  # no card: method and base from config.json, parameters from the weights' header
    assert run["error"] is None and run["checkpoint"] == "step_20" and run["method"] == "listed"
    assert run["parameters"] is None and run["parameters_stored"] == 5 * 3 + 3
    assert run["base"] == {"base_path": "/data/base"}
    assert rows["exports/broken"]["error"] and "config.json" in rows["exports/broken"]["error"]


def test_every_shipped_checkpoint_is_listed_with_its_card():
    rows = {r["name"]: r for r in list_models([], shipped=True)}
    shipped = {n.relative_to(REPO / "assets" / "checkpoints").as_posix()
               for n, _ in find_models(REPO / "assets" / "checkpoints", max_depth=2)}
    assert set(rows) == shipped and {"sola", "lacwm", "fera/fera", "transnormal", "deepvrm", "automot"} <= shipped
    for name, r in rows.items():
        card = read_card(r["path"])
        assert r["error"] is None, name
        assert r["method"] == card["method"] and r["parameters"] == card.get("parameters"), name
        assert r["training_domain"] == card["training_domain"], name


def _numbers(metrics) -> list[float]:
    if isinstance(metrics, dict):
        return [x for v in metrics.values() for x in _numbers(v)]
    if isinstance(metrics, (int, float)) and not isinstance(metrics, bool):
        return [float(metrics)]
    return []


def test_every_shipped_checkpoint_states_measured_metrics_or_why_not():
    rows = list_models([], shipped=True)
    assert len(rows) >= 12
    for r in rows:
        numbers = _numbers(r["metrics"])
        if not numbers:  # allowed only with a reason on the card, which the listing shows
            assert r.get("metrics_note"), f"{r['name']}: no measured metrics in its card and no metrics_note"
            continue
        assert all(math.isfinite(x) for x in numbers), r["name"]
        assert "metrics: —" not in format_rows([r]), r["name"]


def test_the_metric_writers_keep_the_card_and_a_reexport_keeps_them(tmp_path):
    from core.pretrained import card_body, write_card_metrics

    for i, write in enumerate((write_card_metrics, write_card_metrics)):  # a fresh card, then one already written
        folder = tmp_path / f"m{i}"
        _Listed(_Cfg(width=4)).save_pretrained(folder, card={"data": "d", "training_domain": "t"}, body="Body.\n")
        if i:
            write(folder, {"val_acc": 0.5})
        write(folder, {"driving_score_pct": 61.5, "split": "5 scenarios x 5 episodes"})
        row = list_models([folder], shipped=False)[0]
        assert row["metrics"] == {"driving_score_pct": 61.5, "split": "5 scenarios x 5 episodes"}
        assert row["data"] == "d" and row["training_domain"] == "t" and card_body(folder) == "Body.\n"
        card = {k: v for k, v in read_card(folder).items() if k not in ("method", "model_class", "parameters",
                                                                          "weights")}
        _Listed.from_pretrained(folder).save_pretrained(tmp_path / f"again{i}", card=card, body=card_body(folder))
        assert read_card(tmp_path / f"again{i}")["metrics"] == row["metrics"]


def test_the_command_from_a_users_folder_lists_and_never_writes(tmp_path):
    user = _users_folder(tmp_path)
    before = folder_digest(user)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert REPO not in cwd.resolve().parents
    proc = subprocess.run([EMBODIED, "models", str(user)], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr  # the broken folder: listed with its error, the others shown
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("embodied")]
    assert len(err) == 1 and "exports/broken" in err[0]
    assert "exports/good  (local:" in proc.stdout and "metrics: success=0.75  split.n=40" in proc.stdout
    assert "runs/r1  (local:" in proc.stdout and "checkpoint: step_20" in proc.stdout
    assert "sola  (shipped:" in proc.stdout
    assert folder_digest(user) == before and not list(cwd.iterdir())

    proc = subprocess.run([EMBODIED, "models", "--no-shipped", "--json", str(user / "exports" / "good")], cwd=cwd,
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["name"] for r in rows] == ["good"] and rows[0]["metrics"]["success"] == 0.75

    proc = subprocess.run([EMBODIED, "models", str(tmp_path / "nowhere")], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == f"embodied: error: {tmp_path / 'nowhere'}: no such folder"


def test_the_forensics_card_tool_never_writes_a_detector_folder_it_was_given(tmp_path, monkeypatch, capsys):
    """``--checkpoint DIR`` is the user's detector: measured and printed, not written; only the shipped card is."""
    import perception.forensics.card as card

    folder = tmp_path / "mydet"
    _Listed(_Cfg(width=4)).save_pretrained(folder, card={"data": "d"}, body="Body.\n")
    before = folder_digest(folder)
    monkeypatch.setattr(card, "measure", lambda checkpoint, root, views: {"val_acc": 0.75})
    assert card.main(["--checkpoint", str(folder)]) == 0
    assert "val_acc: 0.75" in capsys.readouterr().out and folder_digest(folder) == before
    shipped = tmp_path / "shipped" / "checkpoints" / "deepvrm"
    _Listed(_Cfg(width=4)).save_pretrained(shipped, card={"data": "d"}, body="Body.\n")
    monkeypatch.setattr("core.resources.asset", lambda *parts: tmp_path / "shipped" / Path(*parts))
    assert card.main([]) == 0
    assert read_card(shipped)["metrics"] == {"val_acc": 0.75}
