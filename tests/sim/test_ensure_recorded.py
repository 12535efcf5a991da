"""``sim.recorder.ensure_recorded``: record once, reuse, refuse another spec, survive a kill and concurrent callers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core.errors import DataError
from sim.recorder import ensure_recorded, recorded_spec, spec_path

REPO = Path(__file__).resolve().parents[2]
SPEC = {"env_id": "embodied/Reach-ArmA-v0", "episodes": 2, "seeds": (0, 1), "camera": None}


class Recorder:
    """A ``record`` callback that writes ``payload`` into the staging folder and counts its calls."""

    def __init__(self, payload: bytes = b"episodes", delay: float = 0.0):
        self.payload, self.delay, self.calls = payload, delay, 0
        self._lock = threading.Lock()

    def __call__(self, staging: Path) -> Path:
        with self._lock:
            self.calls += 1
        assert staging.is_dir() and not any(staging.iterdir())  # an empty folder beside the target
        out = staging / "produced.hdf5"
        out.write_bytes(self.payload[: len(self.payload) // 2])
        time.sleep(self.delay)
        out.write_bytes(self.payload)
        return out


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_records_once_then_reuses(tmp_path):
    path = tmp_path / "data" / "reach.hdf5"
    rec = Recorder()
    assert ensure_recorded(path, SPEC, rec) is True
    assert path.read_bytes() == b"episodes" and rec.calls == 1
    assert recorded_spec(path) == json.loads(json.dumps(SPEC))  # stored as JSON (the tuple became a list)
    assert json.loads(spec_path(path).read_text())["data"] == "reach.hdf5"
    assert ensure_recorded(path, dict(SPEC), rec) is False  # the same spec (tuple vs list alike): reused
    assert rec.calls == 1
    assert _hidden(path.parent) == []  # no staging folder or lock left behind


def test_refuses_a_mismatched_spec_in_one_line(tmp_path):
    path = tmp_path / "reach.hdf5"
    ensure_recorded(path, SPEC, Recorder())
    rec = Recorder(b"other")
    with pytest.raises(DataError) as err:
        ensure_recorded(path, {**SPEC, "episodes": 5, "camera": "workspace", "extra": 1}, rec)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(path))
    assert "episodes 2 (asked 5)" in msg and 'camera null (asked "workspace")' in msg
    assert "extra unset (asked 1)" in msg and "env_id" not in msg and "seeds" not in msg
    assert "new path" in msg and "reach.hdf5.spec.json" in msg
    assert rec.calls == 0 and path.read_bytes() == b"episodes"  # nothing recorded, the data untouched
    with pytest.raises(DataError, match="set a new data.root"):
        ensure_recorded(path, {**SPEC, "episodes": 5}, rec, hint="set a new data.root")


def test_data_without_a_spec_is_taken_as_given_after_its_check(tmp_path):
    path = tmp_path / "user.hdf5"
    path.write_bytes(b"user data")
    seen = []
    assert ensure_recorded(path, SPEC, Recorder(), check_unrecorded=seen.append) is False
    assert seen == [path] and not spec_path(path).exists()  # a user's data is never written to

    def refuse(p: Path) -> None:
        raise DataError(p, "recorded with other seeds")

    with pytest.raises(DataError, match="other seeds"):
        ensure_recorded(path, SPEC, Recorder(), check_unrecorded=refuse)


def test_spec_without_data_records_again(tmp_path):
    """A kill between writing the spec and renaming the data leaves the spec alone: the data is recorded anew."""
    path = tmp_path / "reach.hdf5"
    spec_path(path).write_text(json.dumps({"spec": {"stale": True}, "data": path.name}))
    rec = Recorder()
    assert ensure_recorded(path, SPEC, rec) is True and rec.calls == 1
    assert recorded_spec(path) == json.loads(json.dumps(SPEC))


def test_folder_data_and_a_recording_that_produces_nothing(tmp_path):
    path = tmp_path / "frames"

    def record_folder(staging: Path) -> None:
        (staging / "0.png").write_bytes(b"png")

    assert ensure_recorded(path, SPEC, record_folder) is True
    assert sorted(p.name for p in path.iterdir()) == ["0.png"]
    with pytest.raises(DataError, match="produced no data"):
        ensure_recorded(tmp_path / "none.hdf5", SPEC, lambda staging: staging / "missing.hdf5")
    assert not (tmp_path / "none.hdf5").exists() and not spec_path(tmp_path / "none.hdf5").exists()


def test_concurrent_callers_record_once(tmp_path):
    path = tmp_path / "reach.hdf5"
    rec = Recorder(delay=0.5)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_recorded(path, SPEC, rec, wait=30)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rec.calls == 1 and sorted(results) == [False, False, True]
    assert path.read_bytes() == b"episodes"


def test_a_kill_mid_record_leaves_nothing_taken_as_complete(tmp_path):
    path = tmp_path / "reach.hdf5"
    started = tmp_path / "started"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from sim.recorder import ensure_recorded

        def record(staging):
            (staging / "produced.hdf5").write_bytes(b"half")
            Path({str(started)!r}).touch()
            time.sleep(120)
            return staging / "produced.hdf5"

        ensure_recorded(Path({str(path)!r}), {SPEC!r}, record)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert proc.poll() is None, "the recording process ended early"
            assert time.monotonic() < deadline, "the recording process did not start"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not path.exists() and not spec_path(path).exists()  # no half dataset, no spec claiming one
    assert any(".recording-" in name for name in _hidden(tmp_path))  # only its hidden staging folder
    rec = Recorder()
    assert ensure_recorded(path, SPEC, rec) is True and rec.calls == 1  # recorded anew, not reused
    assert path.read_bytes() == b"episodes"
    assert not any(".recording-" in name for name in _hidden(tmp_path))  # the stale staging was removed
