"""``core.distributed.main_process_first``: shared data is made once by whichever process comes first, the others
read it, and a failure of the maker is a one-line error on the others rather than a hang or a second attempt."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from core.distributed import FAILED_SUFFIX, main_process_first
from core.outputs import OutputError, lock_folder

REPO = Path(__file__).resolve().parents[2]

# One process of the race: make <root> (a folder with one file) unless it is there, then print what it reads.
MAKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from core.distributed import main_process_first

    root, log, fail = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "fail"
    (log.parent / f"ready-{os.getpid()}").touch()
    while not (log.parent / "go").exists():  # start both at once
        time.sleep(0.01)
    with main_process_first(root, wait=60):
        if not (root / "data.txt").is_file():
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(1.0)  # long enough that the other process is waiting on the lock
            if fail:
                raise ValueError("renderer crashed\\nsecond line")
            root.mkdir()
            (root / "data.txt").write_text(f"made by {os.getpid()}")
    print("READ", (root / "data.txt").read_text())
""")


def _race(tmp_path: Path, fail: bool) -> list[subprocess.CompletedProcess]:
    root, log = tmp_path / "datasets" / "set", tmp_path / "makers.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", MAKER, str(root), str(log), "fail" if fail else "ok"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a racer did not start"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_two_processes_make_the_folder_once_and_both_read_it(tmp_path):
    results = _race(tmp_path, fail=False)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    makers = (tmp_path / "makers.log").read_text().split()
    assert len(makers) == 1  # made once
    reads = {r.stdout.strip() for r in results}
    assert reads == {f"READ made by {makers[0]}"}  # both read the maker's content
    leftovers = [p.name for p in (tmp_path / "datasets").iterdir() if p.name != "set"]
    assert leftovers == []  # no lock file or failure note left beside the data


def test_a_failure_of_the_maker_is_a_one_line_error_on_the_waiter(tmp_path):
    results = _race(tmp_path, fail=True)
    assert len((tmp_path / "makers.log").read_text().split()) == 1  # the waiter did not try again
    by_error = sorted(results, key=lambda r: "DataError" in r.stderr)
    maker, waiter = by_error
    assert maker.returncode != 0 and "ValueError: renderer crashed" in maker.stderr
    assert waiter.returncode != 0
    last = waiter.stderr.strip().splitlines()[-1]
    assert last.startswith("core.errors.DataError: ") and "failed making it: ValueError: renderer crashed " in last
    assert "second line" not in waiter.stderr
    root = tmp_path / "datasets" / "set"
    assert not root.exists()
    # A later run tries afresh (the note is older than its wait) and, succeeding, removes the note.
    note = root.with_name(f".set{FAILED_SUFFIX}")
    assert note.is_file()
    with main_process_first(root):
        root.mkdir()
    assert root.is_dir() and not note.exists()


def test_without_a_lock_or_a_group_the_block_just_runs(tmp_path):
    ran = []
    with main_process_first():
        ran.append(1)
    assert ran == [1] and not dist.is_initialized()
    with pytest.raises(ValueError, match="boom"), main_process_first():
        raise ValueError("boom")


def test_a_failure_in_the_same_process_is_raised_as_is_and_noted(tmp_path):
    root = tmp_path / "set"
    with pytest.raises(KeyError), main_process_first(root):
        raise KeyError("k")
    assert (tmp_path / f".set{FAILED_SUFFIX}").is_file()
    with main_process_first(root):  # not waiting when it failed: tries again
        pass
    assert not (tmp_path / f".set{FAILED_SUFFIX}").exists()


# One rank of a 2-process gloo group: rank 0 makes <folder>/made (or fails), every rank writes what it saw.
GROUP_RANK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch.distributed as dist
    from core.distributed import main_process_first

    rank, store, folder, fail = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "fail"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        with main_process_first():
            if rank == 0:
                time.sleep(0.5)
                if fail:
                    raise RuntimeError("rank 0 could not render\\nmore")
                (folder / "made").write_text("0")
            seen = (folder / "made").read_text() if (folder / "made").exists() else "nothing"
            (folder / f"rank{rank}").write_text(seen)
    except Exception as e:
        (folder / f"rank{rank}").write_text(f"{type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()
""")


@pytest.mark.parametrize("fail", [False, True])
def test_under_a_process_group_rank_0_goes_first_and_its_failure_reaches_the_others(tmp_path, fail):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", GROUP_RANK, str(rank), str(tmp_path / "store"), str(tmp_path),
                               "fail" if fail else "ok"], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errs]
    r0, r1 = (tmp_path / "rank0").read_text(), (tmp_path / "rank1").read_text()
    if fail:
        assert r0 == "RuntimeError: rank 0 could not render\nmore"
        assert r1.startswith("DataError: rank 0: ") and "RuntimeError: rank 0 could not render" in r1
        assert "more" not in r1
    else:
        assert r0 == "0" and r1 == "0"  # rank 1 ran after rank 0 had made it


def test_a_waiter_of_an_unlinked_lock_file_does_not_share_the_lock(tmp_path):
    """The holder unlinks its lock file on release; a waiter that had opened it must not hold it alongside a newer
    caller who locked a new file at the same path."""
    path = tmp_path / "set"
    release_first, entered = threading.Event(), []

    def first():
        with lock_folder(path):
            release_first.wait(30)

    def waiter():
        with lock_folder(path, wait=30):
            start = time.monotonic()
            time.sleep(0.3)
            entered.append((start, time.monotonic()))

    t1 = threading.Thread(target=first)
    t1.start()
    while not (tmp_path / ".set.lock").exists():
        time.sleep(0.01)
    t2 = threading.Thread(target=waiter)
    t2.start()
    time.sleep(0.2)  # the waiter has opened the first lock file and polls it
    release_first.set()
    t1.join()
    with lock_folder(path, wait=30):  # a new caller, usually within the waiter's poll interval: a new file
        mine = time.monotonic()
        time.sleep(1.5)
        mine = (mine, time.monotonic())
    t2.join(30)
    # whoever got it first (the waiter may win the race on a loaded machine), the two never held it together
    assert entered, "the waiter never got the lock"
    (w0, w1), (m0, m1) = entered[0], mine
    assert w1 <= m0 or m1 <= w0, f"both held the lock: waiter {entered[0]}, new caller {mine}"


def test_a_waiter_that_gives_up_leaves_the_holders_lock_file(tmp_path):
    path = tmp_path / "set"
    with lock_folder(path):
        with pytest.raises(OutputError, match="another process"), lock_folder(path, wait=0):
            pass
        assert (tmp_path / ".set.lock").is_file()
        with pytest.raises(OutputError, match="another process"), lock_folder(path, wait=0):
            pass  # still excluded: the file it would have unlinked is the one held
    assert not (tmp_path / ".set.lock").exists()


def test_is_main_process_reads_torchrun_rank_before_the_group_exists(monkeypatch):
    from core.distributed import is_main_process

    monkeypatch.delenv("RANK", raising=False)
    assert is_main_process()
    monkeypatch.setenv("RANK", "1")
    assert not is_main_process()
    monkeypatch.setenv("RANK", "0")
    assert is_main_process()
