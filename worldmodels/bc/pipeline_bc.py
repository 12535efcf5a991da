"""Closed-loop inference with a trained BC model: ``BCPolicy``, the ``sim.api`` policy around ``BCPolicyModel``.

Observation preprocessing (the env's batched observation dict -> the model's uint8 frames, proprio and instruction
embedding), ACT-style action chunking (predict a chunk, execute ``n_action_steps`` of it, re-plan) with one queue
per env index, and the whole-chunk hooks planners and the policy server call (``action_chunk``,
``action_chunk_batch``). The network itself is ``worldmodels.bc.modeling_bc.BCPolicyModel``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from sim.api import batch_of_one
from worldmodels.bc.modeling_bc import BCPolicyModel

__all__ = ["BCPolicy"]


class BCPolicy:
    """Policy around a trained model: predict a chunk, execute ``n_action_steps``, re-plan (ACT-style).

    A ``sim.api.BatchedPolicy``: ``act_batch`` acts for K envs with at most one model forward, over the
    envs whose queue of pending chunk actions is empty; each env index keeps its own queue, cleared by
    ``reset(index=i)`` when env ``i`` starts an episode. Also a per-env ``sim.api.Policy``: ``act`` is
    ``act_batch`` on a batch of one (env index 0), so one instance serves either a single env through
    ``act`` or K envs through ``act_batch``, not both at once. Actions are clipped to
    ``[action_low, action_high]`` when both are given. An L1 head is deterministic; a flow head draws its
    noise from one generator that ``reset(seed=s)`` re-seeds, so an episode started with the same seed
    gets the same actions.

    Args:
        model: The trained model (put in eval mode and moved to ``device``).
        action_low, action_high: (A,) bounds of the env's action box, or None for no clipping.
        device: Where the model runs; observations are moved there, actions come back as numpy.
        text: (text_dim,) embedding of the instruction every env is given (a language-conditioned model).
        obs_adapter: Maps the env's observation dict (batched) to the model's keys, e.g. the env's
            ``demo_obs`` when the model was trained on demonstration files with other key names.
    """

    def __init__(self, model: BCPolicyModel, action_low: np.ndarray | None = None,
                 action_high: np.ndarray | None = None, device: str | torch.device = "cpu",
                 text: np.ndarray | torch.Tensor | None = None,
                 obs_adapter: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None):
        self.model = model.eval().to(device)
        self.device = torch.device(device)
        self.low, self.high = action_low, action_high
        if model.config.language and text is None:
            raise ValueError("a language-conditioned BC model needs the instruction's embedding (text)")
        self.text = None if text is None else torch.as_tensor(text, dtype=torch.float32).reshape(1, -1).to(device)
        self.obs_adapter = obs_adapter
        self._queues: dict[int, deque[np.ndarray]] = {}  # env index -> pending (A,) actions of its chunk
        self._generator = torch.Generator(self.device)
        self._generator.manual_seed(0)

    def reset(self, seed: int | None = None, index: int | None = None) -> None:
        """Drop the pending chunk actions of env ``index`` (of every env when None); a seed re-seeds the
        flow head's noise."""
        if seed is not None:
            self._generator.manual_seed(int(seed) % (2**63))
        if index is None:
            self._queues.clear()
        else:
            self._queues.pop(index, None)

    @torch.no_grad()
    def act_batch(self, obs: dict[str, np.ndarray], infos: Sequence[dict[str, Any]] | None = None) -> np.ndarray:
        """Actions for K envs.

        Args:
            obs: ``image_key`` (and ``wrist_image_key``) -> (K, H, W, 3) uint8 and, if the model uses
                proprio, each of its proprio keys -> (K, P_k) float; row ``i`` is env ``i``'s observation
                (after ``obs_adapter``).
            infos: The K envs' infos (unused).

        Returns:
            (K, A) float32: row ``i`` the next action of env ``i``'s chunk queue, refilled (one forward for
            every env whose queue ran empty) with the first ``n_action_steps`` actions of a new chunk.

        ``obs`` is read only when some env re-plans (K is ``len(infos)`` when given), so an env that renders
        its cameras on demand (``sim.libero.env.LiberoEnv(lazy_images=True)``) renders a frame per re-plan,
        not per step.
        """
        c = self.model.config
        n = len(infos) if infos is not None else len(np.asarray(obs[c.image_key]))
        need = [i for i in range(n) if not self._queues.get(i)]
        if need:
            if self.obs_adapter is not None:
                obs = self.obs_adapter(obs)
            chunks = self._predict(obs, slice(None) if len(need) == n else need)
            for row, i in enumerate(need):
                self._queues[i] = deque(chunks[row, : c.n_action_steps])
        actions = np.stack([self._queues[i].popleft() for i in range(n)]).astype(np.float32)
        return self._clip(actions)

    @torch.no_grad()
    def action_chunk(self, obs: dict[str, Any], info: dict[str, Any] | None = None) -> np.ndarray:
        """(horizon, A) float32: the whole chunk the model predicts from one env's ``obs``, clipped like
        ``act``; the pending queues are left alone (``sim.api``'s hook for planners' proposals)."""
        obs = {k: np.asarray(v)[None] for k, v in obs.items()}
        if self.obs_adapter is not None:
            obs = self.obs_adapter(obs)
        return self._clip(self._predict(obs, slice(None))[0])

    @torch.no_grad()
    def action_chunk_batch(self, obs: dict[str, np.ndarray],
                           instructions: Sequence[str | Sequence[str] | None] | None = None) -> np.ndarray:
        """(K, horizon, A) float32: the whole chunks for K observations in ONE forward, clipped like ``act``.

        The policy-server hook (``sim.api``): no queue is touched, so the K rows may come from K different
        clients. ``instructions`` gives row ``i``'s instruction for a language-conditioned model (None or a None
        row: the instruction the policy was built with), or several names of it (LIBERO's benchmark text and its
        BDDL text): the first the checkpoint was trained on uses its stored embedding, as ``load_policy`` does in
        process; when none was, the first is encoded once with the model's text encoder and kept.
        """
        obs = {k: np.asarray(v) for k, v in obs.items()}
        if self.obs_adapter is not None:
            obs = self.obs_adapter(obs)
        n = len(np.asarray(obs[self.model.config.image_key]))
        text = None
        if self.model.config.language and instructions is not None:
            rows = [self._embedding(t) for t in instructions]
            if len(rows) != n:
                raise ValueError(f"{len(rows)} instructions for {n} observations")
            text = torch.stack(rows).to(self.device)
        return self._clip(self._predict(obs, slice(None), text=text))

    def _embedding(self, names: str | Sequence[str] | None) -> torch.Tensor:
        """(text_dim,) embedding of one instruction, given as one or several names (see ``action_chunk_batch``)."""
        names = [names] if isinstance(names, str) or names is None else list(names)
        names = [str(t) for t in names if t is not None and str(t).strip()]
        if not names:
            if self.text is None:
                raise ValueError("this BC model is language-conditioned: the request carries no instruction")
            return self.text[0]
        cache = self.__dict__.setdefault("_text_cache", {})
        text = tuple(names)
        if text not in cache:
            i = next((j for j in map(self.model.task_index, names) if j is not None), None)
            if i is not None:
                cache[text] = torch.as_tensor(self.model.task_embeddings[i], dtype=torch.float32).reshape(-1)
            else:
                from worldmodels.bc.task import load_text_encoder

                vec = load_text_encoder(self.model.config.text_encoder).encode([names[0]])[0]
                cache[text] = torch.as_tensor(vec, dtype=torch.float32).reshape(-1)
        return cache[text].to(self.device)

    def _clip(self, actions: np.ndarray) -> np.ndarray:
        if self.low is not None and self.high is not None:
            actions = np.clip(actions, self.low, self.high)
        return actions.astype(np.float32)

    def _predict(self, obs: dict[str, np.ndarray], rows, text: torch.Tensor | None = None) -> np.ndarray:
        """(n, horizon, A) chunks of the rows ``rows`` of a batched observation in the model's keys (``text``:
        (n, text_dim) per-row instruction embeddings, else the policy's own instruction)."""
        c = self.model.config

        def pixels(key: str) -> torch.Tensor:
            frames = np.ascontiguousarray(np.asarray(obs[key])[rows])
            return torch.as_tensor(frames).permute(0, 3, 1, 2).to(self.device)

        image = pixels(c.image_key)
        wrist = pixels(c.wrist_image_key) if c.wrist_image_key else None
        proprio = None
        if c.proprio_dim:
            prop = np.concatenate([np.asarray(obs[k], dtype=np.float32)[rows] for k in c.proprio_keys], -1)
            proprio = torch.as_tensor(prop).to(self.device)
        extra = {"wrist": wrist} if wrist is not None else {}
        if text is not None:
            extra["text"] = text
        elif self.text is not None:
            extra["text"] = self.text.expand(len(image), -1)
        return self.model(image, proprio, generator=self._generator, **extra).float().cpu().numpy()

    def act(self, obs: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """(A,) float32 action for one env (env index 0 of ``act_batch``); ``obs`` is read only to re-plan."""
        return self.act_batch(batch_of_one(obs), [info])[0]
