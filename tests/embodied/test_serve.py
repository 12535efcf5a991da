"""`embodied serve` and `--policy ws://` in the closed loops: our harness against our server, openpi-client against our
server, a lost server mid-evaluation, and the refusals (privileged policies, an exposed host without a key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from core.serving import FieldSpec, FunctionBackend, PolicyServer, ServerUnavailable

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

SUITE, ENV_ID = "libero_spatial", "embodied/Libero-spatial-0-v0"
EMBODIED = [sys.executable, "-m", "embodied"]


def _bc_checkpoint(folder: Path) -> Path:
    """A tiny language-conditioned LIBERO BC (agent view + wrist at 32 px, ee_states + gripper), random weights, whose
    task table holds libero_spatial task 0's BDDL text, as one trained on LIBERO's demo files does (the openpi
    client sends the benchmark text: the server must find the same embedding as the policy in process)."""
    from sim.libero.suites import get_task
    from worldmodels.bc.configuration_bc import BCConfig
    from worldmodels.bc.modeling_bc import BCPolicyModel

    task = get_task(SUITE, 0)
    cfg = BCConfig(channels=[8, 16], num_keypoints=4, hidden_dim=32, horizon=8, n_action_steps=5, image_size=32,
                   image_key="agentview_rgb", wrist_image_key="eye_in_hand_rgb", proprio_key="ee_states",
                   extra_proprio_keys=["gripper_states"], language=True, task_texts=[task.bddl_language, "stack the bowls"],
                   text_dim=6, action_dim=7, proprio_dim=8, dropout=0.0, image_convention="rot180")
    torch.manual_seed(0)
    model = BCPolicyModel(cfg)
    model.set_task_embeddings(torch.nn.functional.normalize(torch.randn(2, 6), dim=-1))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bc_server(tmp_path_factory):
    from embodied.serve import build_backend

    ckpt = _bc_checkpoint(tmp_path_factory.mktemp("bc") / "ckpt")
    backend = build_backend(str(ckpt), ENV_ID)
    with PolicyServer(backend, port=0, max_batch=4, max_wait_ms=2) as server:
        yield ckpt, server


def test_served_bc_metadata_and_first_chunk_match_the_policy_in_process(bc_server):
    from core.serving import PolicyClient
    from sim.libero.env import LiberoEnv
    from sim.libero.openpi import openpi_observation
    from worldmodels.bc.task import make_policy

    ckpt, server = bc_server
    client = PolicyClient(server.url)
    meta = client.metadata
    assert (meta["family"], meta["action_dim"], meta["chunk_length"], meta["replan_steps"]) == ("libero", 7, 8, 5)
    assert (meta["render_size"], meta["image_convention"], meta["wire"]) == (32, "rot180", "openpi-libero")
    assert meta["observation_spec"]["observation/image"] == {"shape": [224, 224, 3], "dtype": "uint8"}
    assert meta["observation_spec"]["observation/state"]["shape"] == [8]
    env = LiberoEnv(SUITE, 0, image_size=32, wrist_image=True)
    try:
        obs, _ = env.reset(seed=0, options={"init_state_id": 0})
        local = make_policy(env, ckpt).action_chunk(obs)
        reply = client.infer(openpi_observation(obs, env.task.language))
    finally:
        env.close()
        client.close()
    assert reply["actions"].shape == (8, 7)
    # the wire resizes 32 -> 224 (bilinear, as openpi) and the server back to 32 (area): nearly the same frames
    np.testing.assert_allclose(reply["actions"], local, atol=0.05)


def test_harness_against_our_server_equals_the_policy_in_process(bc_server, tmp_path):
    from sim.libero.evaluate import evaluate_libero

    ckpt, server = bc_server
    run = dict(task_ids=[0], episodes_per_task=2, max_steps=12, settle_steps=2, videos=0, progress=False)
    local = evaluate_libero(str(ckpt), SUITE, out=tmp_path / "local", **run)
    served = evaluate_libero(server.url, SUITE, out=tmp_path / "served", replan_steps=5, **run)
    fields = [(r["init_state_id"], r["seed"], r["success"], r["steps"], r["failure"]) for r in local["per_episode"]]
    assert fields == [(r["init_state_id"], r["seed"], r["success"], r["steps"], r["failure"])
                      for r in served["per_episode"]]
    stats = served["per_episode"][0]["policy_stats"]
    assert stats["requests"] == 3 and stats["latency_ms_p50"] > 0  # 12 steps, re-planned every 5
    assert served["overall"]["latency"]["requests"] == 6
    assert served["config"]["policy"] == server.url


def test_openpi_action_chunk_broker_runs_a_libero_episode_through_our_server(bc_server):
    from openpi_client.action_chunk_broker import ActionChunkBroker
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from sim.libero.env import LiberoEnv
    from sim.libero.openpi import openpi_observation

    _, server = bc_server
    before = server.stats()["requests"]
    broker = ActionChunkBroker(WebsocketClientPolicy(host="127.0.0.1", port=server.port), action_horizon=5)
    env = LiberoEnv(SUITE, 0, image_size=32, wrist_image=True)
    try:
        obs, _ = env.reset(seed=0, options={"init_state_id": 1})
        for _ in range(10):
            action = broker.infer(openpi_observation(obs, env.task.language))["actions"]
            assert action.shape == (7,)
            obs, *_ = env.step(action)
    finally:
        env.close()
    assert server.stats()["requests"] - before == 2  # one request per 5 steps


# ---------------------------------------------------------------------------------------- a lost server
def _libero_spec() -> dict:
    from sim.libero.openpi import OPENPI_LIBERO_SPEC

    return {k: FieldSpec(tuple(s), d) for k, (s, d) in OPENPI_LIBERO_SPEC.items()}


def _still(batch):  # hold the arm still, gripper open: a chunk of 4
    return np.tile(np.array([0, 0, 0, 0, 0, 0, -1], np.float32), (len(batch), 4, 1))


META = {"family": "libero", "action_dim": 7, "render_size": 32, "replan_steps": 4}


def test_a_lost_server_reruns_its_episode_once_back_and_nothing_is_counted_twice(tmp_path, capfd):
    from sim.libero.evaluate import EPISODES_FILE, evaluate_libero

    backend = FunctionBackend(_still, _libero_spec(), META)
    server = PolicyServer(backend, port=0).start()
    port = server.port
    restarted: list[PolicyServer] = []

    def outage():  # once the first episode is under way: down for ~1.5 s, then back on the same port
        while backend.calls < 2:
            time.sleep(0.01)
        server.stop()
        time.sleep(1.5)
        restarted.append(PolicyServer(FunctionBackend(_still, _libero_spec(), META), port=port).start())

    t = threading.Thread(target=outage, daemon=True)
    t.start()
    try:
        info = evaluate_libero(server.url, SUITE, task_ids=[0], episodes_per_task=2, max_steps=16, settle_steps=1,
                               videos=0, out=tmp_path / "run", progress=False)
    finally:
        t.join(10)
        for s in restarted:
            s.stop()
    lines = [json.loads(x) for x in (tmp_path / "run" / EPISODES_FILE).read_text().splitlines()]
    assert sorted(r["init_state_id"] for r in lines) == [0, 1]  # each episode once
    assert all(r["failure"] == "timeout" and r["steps"] == 16 for r in lines)
    assert info["overall"]["failures"] == {"timeout": 2}
    assert "retrying when the server is back" in capfd.readouterr().err


def test_a_server_that_does_not_come_back_stops_the_run_which_resumes_later(tmp_path, monkeypatch):
    import sim.remote
    from sim.libero.evaluate import EPISODES_FILE, evaluate_libero

    monkeypatch.setattr(sim.remote, "SERVER_WAIT_S", 1.0)
    backend = FunctionBackend(_still, _libero_spec(), META)
    server = PolicyServer(backend, port=0).start()
    port = server.port
    run = dict(task_ids=[0], episodes_per_task=3, max_steps=8, settle_steps=1, videos=0, progress=False)

    def outage():  # down during the second episode, for good
        while backend.calls < 3:
            time.sleep(0.01)
        server.stop()

    t = threading.Thread(target=outage, daemon=True)
    t.start()
    with pytest.raises(ServerUnavailable, match=f"127.0.0.1:{port}"):
        evaluate_libero(f"ws://127.0.0.1:{port}", SUITE, out=tmp_path / "run", **run)
    t.join(10)
    done = [json.loads(x) for x in (tmp_path / "run" / EPISODES_FILE).read_text().splitlines()]
    assert [r["init_state_id"] for r in done] == [0]  # the interrupted episode was not written
    with PolicyServer(FunctionBackend(_still, _libero_spec(), META), port=port) as again:
        info = evaluate_libero(again.url, SUITE, out=tmp_path / "run", **run)
    lines = (tmp_path / "run" / EPISODES_FILE).read_text().splitlines()
    assert sorted(json.loads(x)["init_state_id"] for x in lines) == [0, 1, 2]
    assert info["overall"]["n_episodes"] == 3 and info["overall"]["episodes_this_run"] == 2


# ------------------------------------------------------------------------------------------- the CLI
def _serve(args: list[str], env=None) -> tuple[subprocess.Popen, str]:
    """Start `embodied serve ARGS --port 0`; returns the process and its ws:// url (from its ready line)."""
    proc = subprocess.Popen([*EMBODIED, "serve", *args, "--port", "0"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"embodied serve exited {proc.returncode}")
        if " at ws://" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, line.split(" at ", 1)[1].split(";", 1)[0].split(" ", 1)[0]
    proc.kill()
    raise AssertionError("embodied serve did not start in 120 s")


def test_drive_eval_against_served_automot_equals_in_process_and_sigterm_exits_0(tmp_path):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    proc, url = _serve(["automot"])
    try:
        meta = WebsocketClientPolicy(url).get_server_metadata()
        assert (meta["family"], meta["action_dim"], meta["wire"]) == ("driving", 2, "observation/<env key>")
        assert meta["observation_spec"]["observation/ego_state"] == {"shape": [9], "dtype": "float32"}
        common = ["drive", "eval", "--scenario", "highway", "--episodes", "2", "--horizon-s", "6", "--no-video"]
        for policy, out in ((url, "served"), ("automot", "local")):
            r = subprocess.run([*EMBODIED, *common, "--policy", policy, "--out", str(tmp_path / out)],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stderr[-2000:]
            head = next(line for line in r.stdout.splitlines() if line.startswith("scenario"))
            lat = next(line for line in r.stdout.splitlines() if line.startswith("highway")).split()
            assert head.split()[-5:] == ["latency", "p50", "ms", "p99", "ms"] and float(lat[-2]) > 0  # beside DS
        rows = {out: [json.loads(x) for x in (tmp_path / out / "highway" / "episodes.jsonl").read_text().splitlines()]
                for out in ("served", "local")}
        for a, b in zip(rows["served"], rows["local"], strict=True):
            assert (a["seed"], a["driving_score"], a["success"]) == (b["seed"], b["driving_score"], b["success"])
        r = subprocess.run([*EMBODIED, "sim", "rollout", "embodied/Drive-Highway-v0", "--policy", url, "--episodes",
                            "1", "--out", str(tmp_path / "rollout"), "--no-video"], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0 and "success" in r.stdout, r.stderr[-2000:]
    finally:
        proc.terminate()  # SIGTERM: finish what is in flight, exit 0
        assert proc.wait(60) == 0


@pytest.mark.parametrize("args, message", [
    (["idm"], "privileged state"),
    (["expert"], "privileged state"),
    (["random", "--env", "embodied/Drive-Highway-v0", "--host", "0.0.0.0"], "needs an API key"),
    (["random"], "random needs --env"),
])
def test_serve_refuses_in_one_line(args, message):
    r = subprocess.run([*EMBODIED, "serve", *args, "--port", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ------------------------------------------------------------------------------- a server nobody here wrote
class OpenpiStandIn:
    """openpi's policy server as its repository writes it, rebuilt from openpi-client's msgpack_numpy and websockets:
    metadata first, then observation -> ``{"actions": chunk}``; on error a text frame with the traceback, then close
    (1011). It records what it was sent."""

    def __init__(self, chunk: np.ndarray):
        import asyncio

        self.chunk, self.seen, self.port = chunk, [], None
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self):
        import traceback

        from openpi_client import msgpack_numpy
        from websockets.asyncio.server import serve

        async def handler(ws):
            packer = msgpack_numpy.Packer()
            await ws.send(packer.pack({"policy": "stand-in"}))
            async for message in ws:
                try:
                    obs = msgpack_numpy.unpackb(message)
                    self.seen.append(obs)
                    await ws.send(packer.pack({"actions": self.chunk}))
                except Exception:  # noqa: BLE001 - as openpi's server does
                    await ws.send(traceback.format_exc())
                    await ws.close(code=1011, reason="Internal server error")
                    return

        async def main():
            async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
                self.port = server.sockets[0].getsockname()[1]
                self.stop = self.loop.create_future()
                self.ready.set()
                await self.stop

        self.loop.run_until_complete(main())

    def close(self):
        self.loop.call_soon_threadsafe(self.stop.set_result, None)
        self.thread.join(10)


def test_libero_eval_sends_openpis_libero_observation_to_an_openpi_server(tmp_path):
    from sim.libero.evaluate import evaluate_libero
    from sim.libero.suites import get_task

    chunk = np.tile(np.array([0, 0, 0.2, 0, 0, 0, -1], np.float32), (10, 1))  # openpi's LIBERO chunks are 10 long
    server = OpenpiStandIn(chunk)
    try:
        info = evaluate_libero(f"ws://127.0.0.1:{server.port}", SUITE, task_ids=[0], episodes_per_task=1, max_steps=6,
                               settle_steps=1, videos=0, out=tmp_path / "run", replan_steps=5, progress=False)
    finally:
        server.close()
    assert len(server.seen) == 2  # 6 steps, 5 actions of each chunk
    obs = server.seen[0]
    assert sorted(obs) == ["observation/image", "observation/state", "observation/wrist_image", "prompt"]
    for key in ("observation/image", "observation/wrist_image"):
        assert obs[key].shape == (224, 224, 3) and obs[key].dtype == np.uint8 and obs[key].std() > 5
    assert obs["observation/state"].shape == (8,) and obs["prompt"] == get_task(SUITE, 0).language
    rec = info["per_episode"][0]
    assert (rec["steps"], rec["failure"], rec["policy_stats"]["requests"]) == (6, "timeout", 2)
