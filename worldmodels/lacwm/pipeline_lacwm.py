"""Planning by candidate selection with a LAC-WM / EAC-WM checkpoint, and its ``sim.api.Policy``.

Every ``frame_skip`` control steps the planner samples ``num_candidates`` action sequences of ``horizon``
transitions from a proposal, imagines each with the world model (projector / encoder + FDM), scores the
imagined last frame by its pixel distance to a goal image, and executes the first transition of the best
one (MPC). ``select="random"`` picks a random candidate instead (the baseline: same proposals, no model).

Proposal: half the candidates hold the env's scripted expert action (evaluated on the current state) plus
Gaussian noise; the rest are smooth random walks. Goal images come from ``ExpertGoal``: the scripted
expert rolled out (noise-free) in a shadow copy of the env reset with the episode's seed; its last frame
is the goal (privileged, as a goal-image benchmark provides one).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from core.logging import get_logger

log = get_logger("embodied.lacwm")


class ExpertGoal:
    """Goal image per episode seed: the last frame of a noise-free expert rollout in a shadow env."""

    def __init__(self, env_id: str, image_size: int, max_steps: int = 60, camera: str | None = None):
        self.env_id, self.image_size, self.max_steps = env_id, image_size, max_steps
        self.env_kwargs = {"image_size": image_size, **({"camera": camera} if camera else {})}
        self._env = None

    def __call__(self, seed: int | None) -> np.ndarray:
        import gymnasium as gym

        if self._env is None:
            self._env = gym.make(self.env_id, **self.env_kwargs)
        obs, info = self._env.reset(seed=seed)
        expert = self._env.unwrapped.make_expert(noise=0.0, seed=seed)
        expert.reset(seed)
        for _ in range(self.max_steps):
            obs, _, term, trunc, info = self._env.step(expert.act(obs, info))
            if term or trunc:
                break
        return obs["image"]

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class CandidateSelectionPlanner:
    """``sim.api.Policy``: sample candidates, imagine with the world model, act on the best.

    Args:
        model: A LAC-WM / EAC-WM with a projector / encoder for ``embodiment``.
        embodiment: The embodiment name (as recorded in the data, e.g. ``"Panda+InspireHand"``).
        env: The env to act in (action space, scripted expert for proposals).
        goal_fn: ``seed -> (H, W, 3) uint8`` goal image.
        num_candidates, horizon: Candidates per decision and transitions imagined per candidate.
        select: ``"model"`` (closest imagined end frame) or ``"random"``.
        noise: Std of the Gaussian noise on expert-held proposals (normalised action units).
        expert_fraction: Share of the candidates proposed by the (noisy) expert; the rest are random walks.
        score_pool: Average-pool factor applied to the imagined and goal frames before their squared distance
            (1: raw pixels). Pooling compares where things are rather than their sharpness: imagined frames
            blur with the horizon, and on raw pixels a blurry frame can be closer to any goal than a sharp one.
    """

    def __init__(self, model, embodiment: str, env: Any, goal_fn, num_candidates: int = 16, horizon: int = 4,
                 select: str = "model", noise: float = 0.4, expert_fraction: float = 0.5, score_pool: int = 1):
        if select not in ("model", "random"):
            raise ValueError(f"select must be 'model' or 'random', got {select!r}")
        self.model = model.eval()
        self.encoder = model.action_encoder(embodiment)
        self.env, self.goal_fn = env, goal_fn
        self.space = env.action_space
        self.skip = model.config.frame_skip
        self.n, self.h, self.select, self.noise = num_candidates, horizon, select, noise
        self.expert_fraction, self.score_pool = expert_fraction, score_pool
        make = getattr(env.unwrapped, "make_expert", None)
        self.expert = make(noise=0.0) if make is not None else None
        self.rng = np.random.default_rng(0)
        self.goal: torch.Tensor | None = None
        self._queue: list[np.ndarray] = []
        self.decisions = 0

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(None if seed is None else seed + 104729)
        if self.expert is not None:
            self.expert.reset(seed)
        self.goal = self.model.codec.to_float(torch.from_numpy(np.ascontiguousarray(self.goal_fn(seed)))
                                              .permute(2, 0, 1)[None])
        self._queue = []

    def candidates(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """(N, horizon, skip, A) candidate actions in the env's action box."""
        a_dim = self.space.shape[0]
        lo, hi = self.space.low, self.space.high
        out = np.empty((self.n, self.h, self.skip, a_dim), np.float32)
        n_exp = int(round(self.n * self.expert_fraction)) if self.expert is not None else 0
        if n_exp:
            base = np.asarray(self.expert.act(obs, info), np.float32)
            out[:n_exp] = base + self.noise * self.rng.normal(size=(n_exp, 1, 1, a_dim))
        m = self.n - n_exp
        start = self.rng.uniform(-0.5, 0.5, (m, 1, a_dim))
        walk = start + np.cumsum(0.2 * self.rng.normal(size=(m, self.h * self.skip, a_dim)), axis=1)
        out[n_exp:] = walk.reshape(m, self.h, self.skip, a_dim)
        return np.clip(out, lo, hi)

    @torch.no_grad()
    def scores(self, frame: np.ndarray, cands: np.ndarray) -> np.ndarray:
        """Pixel MSE between each candidate's imagined last frame and the goal: (N,), lower is better."""
        x = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None].expand(len(cands), -1, -1, -1)
        acts = torch.from_numpy(cands.reshape(len(cands), self.h, -1))
        imagined = self.model.imagine(x, self.encoder(acts))[:, -1]
        return ((self.pool(imagined) - self.pool(self.goal)) ** 2).flatten(1).mean(1).numpy()

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) frames average-pooled by ``score_pool``, as every frame distance here compares them."""
        return torch.nn.functional.avg_pool2d(x, self.score_pool) if self.score_pool > 1 else x

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        if not self._queue:
            cands = self.candidates(obs, info)
            if self.select == "model":
                best = int(np.argmin(self.scores(obs["image"], cands)))
            else:
                best = int(self.rng.integers(len(cands)))
            self._queue = list(cands[best, 0])
            self.decisions += 1
        return self._queue.pop(0).astype(np.float32)


def load_planner_policy(checkpoint, env, select: str = "model", num_candidates: int = 16, horizon: int = 4):
    """``POLICIES`` factory: a planner on an adapted LAC-WM / EAC-WM checkpoint for ``env``.

    The checkpoint must hold a projector / encoder for the env's embodiment; the goal comes from
    ``ExpertGoal`` on the same env id and camera; the env must render the camera the model was trained on.
    """
    from core.errors import CheckpointError
    from worldmodels.lacwm.modeling_lacwm import WorldModel

    model = WorldModel.from_pretrained(checkpoint)
    config = model.loaded_from["config"]
    trained_camera = (config.get("data") or {}).get("camera")
    camera = getattr(env.unwrapped, "camera", None)
    if trained_camera and camera != trained_camera:
        raise CheckpointError(f"{checkpoint}: the world model was trained on {trained_camera!r} camera frames, the env "
                              f"renders {camera!r} (pass --camera {trained_camera})")
    emb = env.unwrapped.metadata.get("embodiment", "")
    try:
        enc = model.action_encoder(emb)
    except KeyError as e:
        raise CheckpointError(f"{checkpoint}: {e.args[0]}") from None
    from sim.api import PolicySpec

    # what it was built for: sim.rollout refuses an env of other spaces (both shapes named) before a step
    expects = PolicySpec({"image": (None, None, 3)}, (enc.in_dim // model.config.frame_skip,), source=str(checkpoint))
    expects.check(env.observation_space, env.action_space, env.spec.id if env.spec else None)  # before the goal env
    size = env.observation_space["image"].shape[0]
    goal = ExpertGoal(env.spec.id, size, camera=getattr(env.unwrapped, "camera", None))
    policy = CandidateSelectionPlanner(model, emb, env, goal, num_candidates, horizon, select=select)
    policy.expects = expects
    return policy


def planning_eval(checkpoint, env_id: str, episodes: int = 4, seed: int = 2000, image_size: int = 48,
                  max_steps: int = 30, num_candidates: int = 16, horizon: int = 4,
                  camera: str | None = None) -> dict[str, Any]:
    """Success rate of model-based vs random candidate selection on ``env_id`` (same seeds, same proposals)."""
    import functools

    from sim.rollout import RolloutConfig, rollout

    out: dict[str, Any] = {"env": env_id, "episodes": episodes}
    for select in ("model", "random"):
        factory = functools.partial(load_planner_policy, checkpoint, select=select, num_candidates=num_candidates,
                                    horizon=horizon)
        kwargs = {"image_size": image_size, **({"camera": camera} if camera else {})}
        rc = RolloutConfig(env_id=env_id, episodes=episodes, seed=seed, env_kwargs=kwargs,
                           max_episode_steps=max_steps, progress=False)
        s = rollout(rc, policy=factory).summary
        out[select] = {k: s[k] for k in ("success_rate", "mean_return", "mean_length")}
        log.info("planning %s on %s: success %.2f", select, env_id, s["success_rate"])
    return out


# ------------------------------------------------------------------------------------------------- LIBERO
class LiberoExpertGoal:
    """Goal image of a LIBERO episode: the task-solving expert (``sim.libero.solver.LiberoSolver``) run from
    the episode's own start in a shadow env, its frame at success (or at ``max_steps``): privileged, as a
    goal-image benchmark provides one.

    The shadow env (blind, rendering only that frame) is reset as the evaluation resets the real one (the
    same init state id and seed, so the same fixture poses) and gets the same ``settle_steps`` no-ops.
    With ``keep_path`` it renders every step and keeps the frames as ``path`` ((T + 1, H, W, 3) uint8, the
    start to the goal) and the hand's state along it as ``path_states`` ((T + 1, 5): ``ee_pos`` and the two
    finger joints, ``TRACK_DIMS`` of the proprio vector): the sequence ``ProposalPlanner(subgoal=k)`` tracks.
    """

    TRACK_DIMS = (0, 1, 2, 6, 7)  # proprio: ee_pos (m), gripper finger joints (m)

    def __init__(self, env: Any, settle_steps: int = 10, max_steps: int | None = None, keep_path: bool = False):
        from sim.libero.suites import MAX_EPISODE_STEPS

        base = env.unwrapped
        self.task = base.task
        self.image_size = base.image_size
        self.settle_steps = int(settle_steps)
        self.max_steps = int(max_steps or MAX_EPISODE_STEPS[self.task.suite])
        self.keep_path = bool(keep_path)
        self.path: np.ndarray | None = None
        self.path_states: np.ndarray | None = None
        self.solved: bool | None = None
        self._shadow = None

    def __call__(self, init_state_id: int | None, seed: int | None) -> np.ndarray:
        from sim.libero.env import LiberoEnv
        from sim.libero.record import NOOP_ACTION
        from sim.libero.solver import LiberoSolver

        if self._shadow is None:
            self._shadow = LiberoEnv(self.task.suite, self.task.index, image_size=self.image_size,
                                     images=False, render_mode="rgb_array")
        env = self._shadow
        obs, info = env.reset(seed=seed, options={"init_state_id": "sampled" if init_state_id is None
                                                  else int(init_state_id)})
        for _ in range(self.settle_steps):
            obs, _, _, _, info = env.step(NOOP_ACTION)
        expert = LiberoSolver(env, noise=0.0)
        expert.reset(seed)
        dims = list(self.TRACK_DIMS)
        frames = [env.render()] if self.keep_path else []
        states = [np.asarray(obs["proprio"])[dims]] if self.keep_path else []
        for _ in range(self.max_steps):
            obs, _, term, trunc, info = env.step(expert.act(obs, info))
            if self.keep_path:
                frames.append(env.render())
                states.append(np.asarray(obs["proprio"])[dims])
            if term or trunc:
                break
        self.solved = bool(info.get("success"))
        self.path = np.stack(frames) if self.keep_path else None
        self.path_states = np.stack(states).astype(np.float32) if self.keep_path else None
        return frames[-1] if self.keep_path else env.render()

    def close(self) -> None:
        if self._shadow is not None:
            self._shadow.close()
            self._shadow = None


class ProposalPlanner(CandidateSelectionPlanner):
    """``CandidateSelectionPlanner`` whose candidates come from a policy's action chunk (LIBERO, item 5 of
    issue 31): candidate 0 is the chunk as the policy predicts it, the others the chunk plus Gaussian noise
    (one offset per candidate over the whole chunk) on every dim but ``fixed_dims`` (the gripper: noise would
    open a closed hand). ``proposal=None`` is random shooting: every candidate a smooth random walk. The
    chunk is padded to ``horizon * frame_skip`` actions by repeating its last one.

    Args:
        proposal: A ``sim.api.Policy`` (``action_chunk(obs, info)`` when it has it, else ``act`` repeated on
            the same observation after a ``reset``), or None.
        goal_fn: ``(init_state_id, seed) -> (H, W, 3) uint8`` goal image (``LiberoExpertGoal``).
        subgoal: 0 scores candidates against the end goal. ``k > 0`` tracks the expert's path instead
            (``goal_fn.path`` after each call, ``LiberoExpertGoal(keep_path=True)``): at every decision the
            current step is matched to the nearest path step in a window of ``2 k`` steps ahead of the last
            match (progress never goes back), and the goal is the path frame ``k`` steps past it. The match
            is on the hand's state (``goal_fn.path_states`` against the observation's proprio dims
            ``goal_fn.TRACK_DIMS``) when both exist, else on pooled pixels: at 64 px the arm is a small part of
            the frame and pixel matching on a still scene ratchets forward on noise. One end frame rewards
            moving the arm toward its final pose before the grasp; a subgoal a horizon ahead asks the world
            model which candidate makes the next part of the task happen.
        Others: as ``CandidateSelectionPlanner``.
    """

    def __init__(self, model, embodiment: str, env: Any, goal_fn, proposal: Any = None, num_candidates: int = 16,
                 horizon: int = 2, select: str = "model", noise: float = 0.3, score_pool: int = 4,
                 fixed_dims: tuple[int, ...] = (6,), subgoal: int = 0):
        if select not in ("model", "random", "policy"):
            raise ValueError(f"select must be 'model', 'random' or 'policy', got {select!r}")
        if select == "policy" and proposal is None:
            raise ValueError("select='policy' needs a proposal policy")
        if int(subgoal) < 0:
            raise ValueError(f"subgoal must be >= 0 (0: the end goal), got {subgoal}")
        self.proposal = proposal
        self.fixed_dims = tuple(fixed_dims)
        self.env_goal = goal_fn
        self.subgoal = int(subgoal)
        self._path: torch.Tensor | None = None
        self._states: np.ndarray | None = None
        self._obs: dict[str, Any] | None = None
        self.progress = 0
        super().__init__(model, embodiment, env, self._goal, num_candidates, horizon,
                         select="random" if select == "policy" else select, noise=noise, expert_fraction=0.0,
                         score_pool=score_pool)
        self.select = select
        self.expert = None  # candidates come from the proposal, not from the env's scripted expert

    def _goal(self, seed: int | None) -> np.ndarray:
        return self.env_goal(getattr(self.env.unwrapped, "init_state_id", None), seed)

    def reset(self, seed: int | None = None) -> None:
        self.decisions = 0
        if self.select == "policy":  # the proposal alone needs no goal
            self.rng = np.random.default_rng(None if seed is None else seed + 104729)
            self._queue = []
        else:
            super().reset(seed)
        self.progress, self._path, self._states = 0, None, None
        if self.subgoal and self.select == "model":
            path = getattr(self.env_goal, "path", None)
            if path is None:
                raise ValueError("subgoal > 0 needs a goal_fn that keeps the expert's path (.path after each call: "
                                 "LiberoExpertGoal(keep_path=True))")
            self._path = self.model.codec.to_float(torch.from_numpy(np.ascontiguousarray(path)).permute(0, 3, 1, 2))
            self._states = getattr(self.env_goal, "path_states", None)
        if self.proposal is not None:
            self.proposal.reset(seed=seed)

    def track(self, frame: np.ndarray, proprio: np.ndarray | None = None) -> int:
        """Advance ``progress`` to the path step nearest the current one (in the window ahead: by hand state
        when ``proprio`` and the path's states exist, else by ``frame``) and set the goal to the frame
        ``subgoal`` steps past it; returns the goal's index in the path."""
        end = self.progress + 2 * self.subgoal + 1
        if proprio is not None and self._states is not None:
            here = np.asarray(proprio, np.float32)[list(self.env_goal.TRACK_DIMS)]
            self.progress += int(np.linalg.norm(self._states[self.progress: end] - here, axis=1).argmin())
        else:
            x = self.pool(self.model.codec.to_float(torch.from_numpy(np.ascontiguousarray(frame))
                                                     .permute(2, 0, 1)[None]))
            window = self._path[self.progress: end]
            self.progress += int(((self.pool(window) - x) ** 2).flatten(1).mean(1).argmin())
        k = min(self.progress + self.subgoal, len(self._path) - 1)
        self.goal = self._path[k: k + 1]
        return k

    def scores(self, frame: np.ndarray, cands: np.ndarray) -> np.ndarray:
        if self._path is not None:
            self.track(frame, (self._obs or {}).get("proprio"))
        return super().scores(frame, cands)

    def episode_stats(self) -> dict[str, Any]:
        """Kept by ``embodied libero eval`` as the episode's ``policy_stats``: decisions made and whether the
        expert behind the goal image solved the task (a goal it did not reach is no goal)."""
        stats = {"decisions": self.decisions, "goal_solved": getattr(self.env_goal, "solved", None)}
        if self._path is not None:  # how far along the expert's path the episode got
            stats.update(path_progress=self.progress, path_length=len(self._path) - 1)
        return stats

    def chunk(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """(horizon * frame_skip, A) actions the proposal policy would take from ``obs``."""
        n = self.h * self.skip
        if callable(getattr(self.proposal, "action_chunk", None)):
            chunk = np.asarray(self.proposal.action_chunk(obs, info), np.float32)
        else:
            self.proposal.reset()
            chunk = np.stack([np.asarray(self.proposal.act(obs, info), np.float32) for _ in range(n)])
        if len(chunk) < n:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], n - len(chunk), 0)])
        return chunk[:n]

    def candidates(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        if self.proposal is None:
            return super().candidates(obs, info)  # expert_fraction 0, no expert: all random walks
        a_dim = self.space.shape[0]
        base = self.chunk(obs, info).reshape(1, self.h, self.skip, a_dim)
        offset = self.noise * self.rng.normal(size=(self.n, 1, 1, a_dim))
        offset[0] = 0.0
        offset[..., list(self.fixed_dims)] = 0.0
        return np.clip(base + offset, self.space.low, self.space.high).astype(np.float32)

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        self._obs = obs  # the hand state subgoal tracking reads
        if not self._queue and self.select == "policy":
            self._queue = list(self.chunk(obs, info)[: self.skip])
            self.decisions += 1
        return super().act(obs, info)


def libero_planner(env: Any, world_model: str, proposal: str | None = None, select: str = "model",
                   num_candidates: int = 16, horizon: int = 2, noise: float = 0.3, score_pool: int = 4,
                   settle_steps: int = 10, subgoal: int = 0) -> ProposalPlanner:
    """``embodied libero eval`` policy factory (``env -> Policy``, picklable with ``functools.partial``): a
    ``ProposalPlanner`` on a LAC-WM / EAC-WM checkpoint for LIBERO ``env``.

    Args:
        world_model: The world model's folder (``adapted``), trained on agent-view frames of ``env``'s size.
        proposal: A policy checkpoint (loaded with ``core.checkpoint.load_policy``: e.g. the BC policy of
            ``configs/experiment/bc_libero.yaml``) or None for random shooting.
        select: ``"model"`` (the imagined end frame closest to the goal), ``"random"`` (a random candidate:
            the same proposals without the model) or ``"policy"`` (the proposal itself, executed
            ``frame_skip`` actions at a time: the planner's own harness for the policy alone).
        settle_steps: The evaluation's settle steps (the goal's shadow env repeats them).
        subgoal: 0: score against the expert's end frame; k > 0: track the expert's path, goal k steps ahead
            (``ProposalPlanner``).
    """
    from core.checkpoint import load_policy
    from core.errors import CheckpointError
    from sim.api import PolicySpec, policy_expects
    from worldmodels.lacwm.modeling_lacwm import WorldModel

    model = WorldModel.from_pretrained(world_model)
    emb = env.unwrapped.metadata.get("embodiment", "")
    try:
        model.action_encoder(emb)
    except KeyError as e:
        raise CheckpointError(f"{world_model}: {e.args[0]}") from None
    prop = load_policy(proposal, env) if proposal is not None else None
    side = model.config.image_size
    spec = policy_expects(prop) if prop is not None else None
    observation = dict(spec.observation) if spec is not None else {}
    observation["image"] = (side, side, 3)  # the world model's frames: the env renders at its size
    if spec is not None and observation["image"] != spec.observation.get("image", observation["image"]):
        raise CheckpointError(f"{world_model}: the world model reads {side} px frames, the proposal policy "
                              f"{spec.observation['image']}")
    goal = LiberoExpertGoal(env, settle_steps, keep_path=bool(subgoal) and select == "model")
    planner = ProposalPlanner(model, emb, env, goal, proposal=prop, num_candidates=num_candidates, horizon=horizon,
                              select=select, noise=noise, score_pool=score_pool, subgoal=subgoal)
    planner.expects = PolicySpec(observation, env.action_space.shape, source=str(world_model))
    return planner
