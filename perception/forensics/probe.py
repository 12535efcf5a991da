"""The layer-wise probe that motivates K: where in the LLM does semantic information sit, and where forensic?

For every decoder layer k, the input hidden states at the image tokens are mean-pooled into one vector per
image; a linear probe (multinomial logistic regression, trained on one half of the images and scored on the
other) reads either a semantic label (the colour / shape of the largest object in a simulator scene, the
domain photo-vs-simulation; ``perception.forensics.qa`` ground truth) or the forensic label (real / fake of the
GenImage val split). The Deep-VRM paper's observation: semantic accuracy is high from the early-to-middle layers,
so those are frozen, and the artifact signal is injected after them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from perception.forensics.modeling_deepvrm import DeepVRM, hidden_states_before_layers


@torch.no_grad()
def pooled_layer_features(model: DeepVRM, images: np.ndarray, question: str, batch: int = 64) -> np.ndarray:
    """(N, S, S, 3) uint8 -> (layers + 1, N, hidden): mean image-token state entering each layer, and the final
    layer's output (captured as the input of the final norm)."""
    feats: list[np.ndarray] = []
    for i in range(0, len(images), batch):
        x = torch.from_numpy(images[i:i + batch]).permute(0, 3, 1, 2).float().div(255.0)
        b = model._batch(x, question, None)
        seen: list[torch.Tensor] = []
        norm = model.vlm.model.language_model.norm
        h = norm.register_forward_pre_hook(lambda m, a, seen=seen: seen.append(a[0].detach()))
        try:
            states = hidden_states_before_layers(model, x, b["input_ids"], b["attention_mask"])
        finally:
            h.remove()
        states.append(seen[-1])
        mask = (b["input_ids"] == model.image_token).unsqueeze(-1).float()
        pooled = torch.stack([(s * mask).sum(1) / mask.sum(1) for s in states])  # (L+1, B, H)
        feats.append(pooled.float().numpy())
    return np.concatenate(feats, axis=1)


def linear_probe_accuracy(x: np.ndarray, y: np.ndarray, seed: int = 0, steps: int = 300, lr: float = 0.05,
                          weight_decay: float = 1e-3) -> float:
    """Held-out accuracy of a multinomial logistic regression on standardised features (half train, half test)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    tr, te = order[: len(y) // 2], order[len(y) // 2:]
    classes, yi = np.unique(y, return_inverse=True)
    mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-6
    xt = torch.tensor((x - mu) / sd, dtype=torch.float32)
    yt = torch.tensor(yi)
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Linear(x.shape[1], len(classes))
    with torch.no_grad():
        w.weight.normal_(0, 0.01, generator=g)
        w.bias.zero_()
    opt = torch.optim.Adam(w.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(w(xt[tr]), yt[tr])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((w(xt[te]).argmax(-1) == yt[te]).float().mean())


def layer_probe(model: DeepVRM, tasks: dict[str, tuple[np.ndarray, np.ndarray, str]], seed: int = 0
                ) -> dict[str, Any]:
    """``tasks``: name -> (images, labels, question). Returns per task the probe accuracy at every layer input
    (index k = entering layer k; the last = the final layer's output) and the majority-class rate."""
    out: dict[str, Any] = {}
    for name, (images, labels, question) in tasks.items():
        feats = pooled_layer_features(model, images, question)
        _, counts = np.unique(labels, return_counts=True)
        out[name] = {"acc": [linear_probe_accuracy(f, labels, seed) for f in feats],
                     "chance": float(counts.max() / counts.sum()), "n": int(len(labels))}
    return out
