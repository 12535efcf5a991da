"""The output-folder policy: files refused, other runs refused unless --overwrite, one writer, nothing left
behind by a failed run, training folders resumed or marked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from core.outputs import MARKER, OutputError, claim_output, run_marker, written_files


def test_an_existing_file_is_refused(tmp_path):
    f = tmp_path / "out"
    f.write_text("mine")
    with pytest.raises(OutputError, match="exists and is a file"), claim_output(f, command="t"):
        pass
    assert f.read_text() == "mine"


def test_staged_run_appears_only_on_success(tmp_path):
    out = tmp_path / "out"
    with claim_output(out, command="t") as d:
        (d / "a.txt").write_text("1")
        assert not out.exists()  # nothing visible until the command succeeds
    assert (out / "a.txt").read_text() == "1" and run_marker(out)["status"] == "finished"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp or lock left


def test_a_failed_run_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), claim_output(out, command="t") as d:
        (d / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_another_runs_folder_is_refused_unless_overwrite_which_replaces_it_whole(tmp_path):
    out = tmp_path / "out"
    with claim_output(out, command="first") as d:
        (d / "episode_2.mp4").write_text("old")
        (d / "summary.json").write_text("old")
    with pytest.raises(OutputError, match="holds another first run; pass --overwrite"), claim_output(out, command="t"):
        pass
    with pytest.raises(RuntimeError), claim_output(out, command="second", overwrite=True) as d:
        (d / "summary.json").write_text("new")
        raise RuntimeError("fails before the end")
    assert (out / "summary.json").read_text() == "old"  # a failed overwrite keeps the old run intact
    with claim_output(out, command="second", overwrite=True) as d:
        (d / "summary.json").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "summary.json"]  # no stale episode_2.mp4
    assert (out / "summary.json").read_text() == "new"


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "training"])
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_a_folder_no_run_wrote_is_refused_even_with_overwrite(tmp_path, overwrite, staged):
    out = tmp_path / "out"
    (out / "deep").mkdir(parents=True)
    (out / "notes.txt").write_text("user data")
    (out / "deep" / "thesis.tex").write_text("more")
    with pytest.raises(OutputError) as err:
        with claim_output(out, command="t", overwrite=overwrite, staged=staged, signature={"a": 1}):
            pass
    msg = str(err.value)
    assert msg.startswith(f"{out}: exists and holds files no embodied run wrote (deep/thesis.tex, notes.txt)")
    assert "another run" not in msg and "\n" not in msg
    assert (out / "notes.txt").read_text() == "user data" and (out / "deep" / "thesis.tex").read_text() == "more"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial, no lock left


def test_files_a_user_put_into_a_run_folder_are_never_overwritten(tmp_path):
    out = tmp_path / "out"
    with claim_output(out, command="sim rollout") as d:
        (d / "videos").mkdir()
        (d / "videos" / "episode_0.mp4").write_text("v")
        (d / "summary.json").write_text("{}")
    assert run_marker(out)["files"] == ["summary.json", "videos/episode_0.mp4"]  # what the run wrote
    (out / "videos" / "my_edit.mp4").write_text("user")
    for overwrite in (False, True):
        with pytest.raises(OutputError, match=r"holds files the sim rollout run there did not write "
                                              r"\(videos/my_edit\.mp4\); move them out"):
            with claim_output(out, command="sim rollout", overwrite=overwrite):
                pass
    assert (out / "videos" / "my_edit.mp4").read_text() == "user"
    (out / "videos" / "my_edit.mp4").unlink()
    (out / ".DS_Store").write_bytes(b"finder")  # a file browser's clutter is nobody's work
    with claim_output(out, command="sim rollout", overwrite=True) as d:
        (d / "summary.json").write_text("new")
    assert written_files(out) == ["summary.json"]


def test_an_empty_folder_or_one_with_only_a_marker_is_free(tmp_path):
    for i, content in enumerate(([], [".DS_Store"])):
        out = tmp_path / f"empty{i}"
        out.mkdir()
        for name in content:
            (out / name).write_text("")
        with claim_output(out, command="t") as d:  # no --overwrite needed
            (d / "a.txt").write_text("1")
        assert (out / "a.txt").read_text() == "1"


@pytest.mark.parametrize("status", ["running", "failed", "finished"])
def test_a_training_folder_of_this_workspace_is_replaced_by_overwrite(tmp_path, status):
    out = tmp_path / "run"
    out.mkdir()
    (out / MARKER).write_text(f'{{"command": "train bc", "status": "{status}", "signature": {{"lr": 1}}}}')
    (out / "ckpt").write_text("old")
    with pytest.raises(OutputError, match="holds another train bc run; pass --overwrite"):
        with claim_output(out, command="train bc", staged=False, signature={"lr": 2}):
            pass
    with claim_output(out, command="train bc", staged=False, signature={"lr": 2}, overwrite=True) as d:
        assert not (d / "ckpt").exists()  # started clean
    with claim_output(tmp_path / "staged", command="t") as d:
        (d / "x").write_text("1")
    with claim_output(out, command="demo", overwrite=True) as d:  # a staged command may replace it too
        (d / "index.html").write_text("")
    assert written_files(out) == ["index.html"]


def test_in_place_training_resumes_same_config_and_marks_failures(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), claim_output(out, command="train", staged=False, signature={"lr": 1}) as d:
        (d / "ckpt").write_text("step 3")
        raise KeyboardInterrupt
    assert run_marker(out)["status"] == "failed" and run_marker(out)["error"] == "interrupted"
    with claim_output(out, command="train", staged=False, signature={"lr": 1}) as d:
        assert (d / "ckpt").read_text() == "step 3"  # resumed in place
    assert run_marker(out)["status"] == "finished"
    with pytest.raises(OutputError, match="or the same config to resume it"):
        with claim_output(out, command="train", staged=False, signature={"lr": 2}):
            pass


def test_two_processes_cannot_write_one_folder(tmp_path):
    out = tmp_path / "out"
    holder = textwrap.dedent(f"""
        import sys, time
        from core.outputs import claim_output
        with claim_output({str(out)!r}, command="holder") as d:
            print("claimed", flush=True)
            time.sleep(30)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "claimed"
        with pytest.raises(OutputError, match="another process is writing this folder"):
            with claim_output(out, command="second"):
                pass
    finally:
        proc.kill()
        proc.wait()
    with claim_output(out, command="after"):  # the OS released the dead holder's lock
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the killed holder's partial folder is gone


def test_lock_folder_excludes_a_concurrent_writer(tmp_path):
    from core.outputs import lock_folder

    with lock_folder(tmp_path / "run"):
        with pytest.raises(OutputError, match="another process is writing"), claim_output(tmp_path / "run", command="t"):
            pass
    with claim_output(tmp_path / "run", command="t"):
        pass


def test_output_file_checks_suffix_existence_and_folders(tmp_path):
    from core.errors import ConfigError
    from core.outputs import output_file

    assert output_file(tmp_path / "a.MP4", ".mp4") == tmp_path / "a.MP4"
    with pytest.raises(ConfigError, match=r"writes one \.mp4 file; got .*a\.gif, e\.g\. --out .*a\.mp4"):
        output_file(tmp_path / "a.gif", ".mp4")
    with pytest.raises(ConfigError, match=r"new/ is a folder; this command writes one \.mp4 file"):
        output_file(f"{tmp_path}/new/", ".mp4")  # a folder path that does not exist yet
    (tmp_path / "b.mp4").write_bytes(b"x")
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        output_file(tmp_path / "b.mp4", ".mp4")
    assert output_file(tmp_path / "b.mp4", ".mp4", overwrite=True).read_bytes() == b"x"  # untouched until written
    (tmp_path / "c.mp4").mkdir()
    with pytest.raises(ConfigError, match="is a folder"):
        output_file(tmp_path / "c.mp4", ".mp4", overwrite=True)


@pytest.mark.parametrize("kind", ["video", "i2v"])
@pytest.mark.parametrize("out", ["notes.txt", "out/", "out/newvid.txt"])
def test_infer_file_commands_judge_out_by_their_declaration_not_its_value(tmp_path, monkeypatch, capsys, kind,
                                                                          out):
    """`infer video|i2v` take --out FILE.mp4: a .txt file, a folder or a .txt name gets output_file's one line
    (and nothing is staged next to it), not the folder policy's "needs a folder path" / hidden .partial- names."""
    from embodied.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "earlier.mp4").write_bytes(b"x")
    image = tmp_path / "in.png"
    import numpy as np
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(image)
    argv = ["infer", kind, "--out", out] + ([str(image)] if kind == "i2v" else [])
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "this command writes one .mp4 file" in err[0] and "partial" not in err[0], err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.png", "notes.txt", "out"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["earlier.mp4"]
