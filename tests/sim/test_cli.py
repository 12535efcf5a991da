"""`embodied sim` sub-commands run in-process."""

from __future__ import annotations

import argparse

import pytest

from core.errors import ConfigError
from core.io import read_json
from sim.cli import configure_parser


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="embodied sim")
    configure_parser(parser)
    args = parser.parse_args(argv)
    return args.func(args)


def test_sim_list_manipulation(capsys):
    assert _run(["list", "--family", "manipulation"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["ENV", "ID"]
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert rows["embodied/Lift-Sawyer-v0"][1:] == ["manipulation", "Sawyer", "lift", "4"]
    assert rows["embodied/Reach-PandaInspireHand-v0"][-1] == "12"
    assert len(rows) == 12


def test_sim_rollout(tmp_path, capsys):
    rc = _run(["rollout", "embodied/Reach-Panda-v0", "--policy", "scripted", "--episodes", "2",
               "--out", str(tmp_path), "--image-size", "32", "--seed", "3"])
    assert rc == 0
    assert "success 1.00 over 2 episodes" in capsys.readouterr().out
    assert read_json(tmp_path / "summary.json")["success_rate"] == 1.0
    assert len(list((tmp_path / "videos").glob("episode_*.mp4"))) == 2


def test_sim_bad_input():
    with pytest.raises(ConfigError, match="not registered"):
        _run(["rollout", "embodied/Nope-v0", "--episodes", "1", "--out", "/tmp/unused"])
    with pytest.raises(ConfigError, match="--episodes"):
        _run(["rollout", "embodied/Reach-Panda-v0", "--episodes", "0", "--out", "/tmp/unused"])
    with pytest.raises(ConfigError, match="--family"):
        _run(["list", "--family", "space"])
    with pytest.raises(SystemExit):
        _run(["make-dataset", "holograms", "--n", "1", "--out", "/tmp/unused"])


def test_sim_list_describes_every_family(capsys):
    assert _run(["list"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert {r[1] for r in rows} == {"manipulation", "libero", "driving"}
    assert all("?" not in r for r in rows), [r for r in rows if "?" in r][:3]
    by_id = {r[0]: r for r in rows}
    assert by_id["embodied/Drive-Highway-v0"][2:] == ["ego_car", "highway", "2"]
    assert by_id["embodied/Libero-spatial-0-v0"][2] == "Panda" and by_id["embodied/Libero-spatial-0-v0"][-1] == "7"


def test_make_dataset_frames_flag_is_for_videos_only():
    with pytest.raises(ConfigError, match="--frames: only for make-dataset videos"):
        _run(["make-dataset", "normals", "--n", "1", "--frames", "4", "--out", "/tmp/unused"])
    with pytest.raises(ConfigError, match="--frames: must be >= 1"):
        _run(["make-dataset", "videos", "--n", "1", "--frames", "0", "--out", "/tmp/unused"])


def test_make_dataset_source_flags(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--source: only for make-dataset normals / panoramas"):
        _run(["make-dataset", "videos", "--n", "1", "--source", "real", "--out", "/tmp/unused"])
    with pytest.raises(ConfigError, match="--workers: must be >= 1"):
        _run(["make-dataset", "panoramas", "--n", "1", "--workers", "0", "--out", "/tmp/unused"])
    with pytest.raises(ConfigError, match="source"):
        _run(["make-dataset", "panoramas", "--n", "1", "--source", "holodeck", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()  # nothing half-written is left behind
    out = tmp_path / "rooms"
    assert _run(["make-dataset", "panoramas", "--n", "2", "--size", "8", "--spp", "1", "--source", "analytic",
                 "--out", str(out)]) == 0
    assert "from analytic" in capsys.readouterr().out
    assert read_json(out / "meta.json")["splits"] == {"train": 1, "test": 1}


def test_a_dataset_rendered_from_another_source_is_refused(tmp_path):
    from core.errors import DataError
    from core.io import write_json
    from sim.render.dataset_io import check_source, dataset_source

    root = tmp_path / "rooms"
    assert _run(["make-dataset", "panoramas", "--n", "2", "--size", "8", "--spp", "1", "--out", str(root)]) == 0
    check_source(root, "analytic", "data.render_source")
    with pytest.raises(DataError, match="rendered with source 'analytic' but data.render_source is 'mujoco'"):
        check_source(root, "mujoco", "data.render_source")
    # meta.json written before sources existed: the renderer's name says which one it was
    assert dataset_source({"generator": "sim.render.normals (Mitsuba 3 scalar_rgb path tracer)"}) == "procedural"
    assert dataset_source({"generator": "someone else's scanner"}) is None
    write_json(tmp_path / "real" / "meta.json", {"format": "embodied-dense/1"})
    check_source(tmp_path / "real", "mujoco", "data.render_source")  # real data: not ours to judge
    with pytest.raises(DataError, match="framing"):
        check_source(root, "closeup", "data.render_framing", field="framing", default="workspace")
