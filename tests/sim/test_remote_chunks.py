"""sim.remote.ChunkExecutor: which action of which chunk runs at which step, with and without simulated real time."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import ConfigError
from sim.remote import ChunkExecutor, chunk_from_reply


class FakeClock:
    """A clock that a request advances by its latency (seconds)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chunk_source(clock: FakeClock, latencies: list[float], length: int = 4):
    """Request k returns the chunk [[100k + j]] (j = 0..length-1) and takes latencies[k] seconds."""
    calls: list[int] = []

    def request(obs, info):
        k = len(calls)
        calls.append(int(obs["t"]))
        clock.now += latencies[k] if k < len(latencies) else latencies[-1]
        return np.array([[100.0 * k + j] for j in range(length)], np.float32)

    return request, calls


def run(ex: ChunkExecutor, steps: int) -> list[float]:
    return [float(ex.act({"t": t}, {})[0]) for t in range(steps)]


def test_plain_mode_executes_replan_steps_of_each_chunk_and_ignores_latency():
    clock = FakeClock()
    request, calls = chunk_source(clock, [0.5])  # 10 control periods of latency: irrelevant without real time
    ex = ChunkExecutor(request, dt=0.05, replan_steps=3, clock=clock)
    assert run(ex, 7) == [0, 1, 2, 100, 101, 102, 200]
    assert calls == [0, 3, 6]
    assert ex.stats()["held_steps"] == 0 and ex.stats()["requests"] == 3


def test_plain_mode_without_replan_steps_runs_the_whole_chunk():
    clock = FakeClock()
    request, calls = chunk_source(clock, [0.0], length=2)
    ex = ChunkExecutor(request, dt=0.05, replan_steps=None, clock=clock)
    assert run(ex, 5) == [0, 1, 100, 101, 200]
    assert calls == [0, 2, 4]


def test_realtime_with_zero_latency_acts_as_plain_mode():
    clock = FakeClock()
    request, _ = chunk_source(clock, [0.0])
    plain = run(ChunkExecutor(request, dt=0.05, replan_steps=3, clock=clock), 9)
    clock2 = FakeClock()
    request2, _ = chunk_source(clock2, [0.0])
    assert run(ChunkExecutor(request2, dt=0.05, replan_steps=3, realtime=True, clock=clock2), 9) == plain


def test_realtime_holds_before_the_first_chunk_then_skips_its_stale_actions():
    # latency 0.12 s at dt 0.05 s = 2 whole periods: steps 0 and 1 hold the no-op, the chunk observed at step 0
    # lands at step 2 where its actions 0 and 1 are in the past: action 2 runs, then action 3
    clock = FakeClock()
    request, calls = chunk_source(clock, [0.12, 0.0])
    ex = ChunkExecutor(request, dt=0.05, replan_steps=2, realtime=True, hold_action=np.array([-1.0]), clock=clock)
    out = run(ex, 5)
    assert out[:4] == [-1, -1, 2, 3]
    assert calls[0] == 0
    assert ex.stats()["held_steps"] == 2


def test_realtime_continues_the_current_chunk_while_a_request_is_in_flight_then_holds_its_last_action():
    # chunk 0 (latency 0) at step 0; replan after 2 -> request at step 2 takes 3 periods (lands at step 5):
    # steps 2, 3 run chunk 0's actions 2, 3 (its end), step 4 holds action 3, step 5 runs chunk 1's action 3
    clock = FakeClock()
    request, calls = chunk_source(clock, [0.0, 0.15, 0.0])
    ex = ChunkExecutor(request, dt=0.05, replan_steps=2, realtime=True, hold_action=np.array([-1.0]), clock=clock)
    out = run(ex, 6)
    assert out == [0, 1, 2, 3, 3, 103]
    assert calls[:2] == [0, 2]
    assert ex.stats()["held_steps"] == 1
    assert ex.stats()["latency_ms_p50"] == pytest.approx(75.0)  # requests of 0 and 150 ms


def test_reset_starts_a_new_episode_clock():
    clock = FakeClock()
    request, calls = chunk_source(clock, [0.0])
    ex = ChunkExecutor(request, dt=0.05, replan_steps=2, clock=clock)
    run(ex, 3)
    ex.reset()
    assert float(ex.act({"t": 0}, {})[0]) == 200.0  # a fresh request at the episode's first step
    assert ex.stats()["requests"] == 1


def test_bad_arguments_and_replies_are_one_line_errors():
    with pytest.raises(ConfigError, match="replan-steps"):
        ChunkExecutor(lambda o, i: np.zeros((1, 1)), dt=0.05, replan_steps=0)
    with pytest.raises(ValueError, match="no 'actions'"):
        chunk_from_reply({"action": [1.0]}, 7)
    with pytest.raises(ValueError, match=r"expected \(T, 7\)"):
        chunk_from_reply({"actions": np.zeros((5, 6))}, 7)
    assert chunk_from_reply({"actions": np.arange(7.0)}, 7).shape == (1, 7)
