"""Deep-VRM cost: detection throughput and what the deep visual residual path adds to the plain VLM forward.

Model: the experiment's VLM size (``configs/model/deepvrm.yaml``: Qwen2.5-VL class, 8 LLM layers of width 128,
4-block ViT, 64 px images -> 16 image tokens, K = 4), randomly initialised (timing does not depend on the
weights), in eval mode; a batch of ``--batch`` images with the verdict prompt. Timed round-robin in one process
(shared, noisy cores), best of N, CUDA synchronised:

* ``plain``: the base VLM's forward (what LoRA-only / full fine-tuning run; LoRA merged or not, the same shapes).
* ``deepvrm``: Deep-VRM's forward: the same VLM with LoRA on layers >= K, plus V_a (a second ViT + merger on the
  high-pass view) and the injection at layer K. ``residual_vs_plain_forward_time``: the added cost (lower is
  better; the limit is ~2x the ViT's share of the forward, since V_a is a copy of the ViT).
* ``prob_fake``: a full detection (two answer candidates scored) -> ``images_per_s`` (figure).
* ``train_step_deepvrm_vs_lora_time``: one stage-2 training step (forward + backward + AdamW) of Deep-VRM vs the
  LoRA-only arm on the same batch.

``--quick``: batch 8, 3 repeats. JSON: ``benchmarks/results/deepvrm.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.common import (
    RESULTS_DIR,
    default_device,
    interleaved,
    print_table,
    repeated_main,
    write_result,
)

# Every reported ratio: held to a goal (its target and where the number comes from) or a plain figure.
GOALS: dict = {}  # none: these ratios describe the cost, nothing claims a number for them
FIGURES_ONLY = ("residual_vs_plain_forward_time", "train_step_deepvrm_vs_lora_time")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="batch 8, 3 repeats (smoke run)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu) | cpu | cuda[:i]")
    p.add_argument("--batch", type=int, default=None, help="images per forward (default 32; --quick 8)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7; --quick 3)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "deepvrm.json", help="result JSON (<name>.json)")
    return p.parse_args(argv)


def build(arm: str, device: str):
    from core.config import compose, to_object
    from core.vlm import VLMConfig, build_tokenizer, build_vlm
    from perception.forensics.modeling_deepvrm import DeepVRM
    from perception.forensics.task import tokenizer_corpus

    m = to_object(compose(["experiment=deepvrm"]).model)
    tok = build_tokenizer(tokenizer_corpus([]), vocab_size=400)
    torch.manual_seed(0)
    vcfg = VLMConfig(**{**dict(m.vlm), "vocab_size": m.tokenizer_vocab})
    model = DeepVRM(dataclasses.replace(m, arm=arm), base=(build_vlm(vcfg), tok))  # stage 2: residual path on
    return model.to(device), m


def main(argv: Sequence[str] | None = None) -> None:
    from perception.forensics.configuration_deepvrm import VERDICT_PROMPT

    args = parse(argv)
    device = default_device(None if args.device == "auto" else args.device)
    batch = args.batch or (8 if args.quick else 32)
    repeats = args.repeats or (3 if args.quick else 7)
    t_start = time.perf_counter()
    deep, mcfg = build("deepvrm", device)
    lora, _ = build("lora", device)
    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 3, mcfg.image_size, mcfg.image_size, generator=g).to(device)
    b = deep._batch(images, VERDICT_PROMPT, ["fake"] * batch)
    ids, mask = b["input_ids"], b["attention_mask"]

    def fwd(model, residual: bool):
        def run():
            with torch.no_grad():
                model.residual_on = residual
                model(images, ids, mask)
        return run

    deep.eval()
    lora.eval()
    fw = interleaved({"plain": fwd(lora, False), "deepvrm": fwd(deep, True)}, warmup=1, repeats=repeats,
                     device=device)
    det = interleaved({"prob_fake": lambda: deep.prob_fake(images, VERDICT_PROMPT)}, warmup=1, repeats=repeats,
                      device=device)["prob_fake"]
    deep.residual_on = True
    opts = {}

    def step(model, name):
        model.train()
        opts.setdefault(name, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4))

        def run():
            loss = model.training_step({"image": images, **b})["loss"]
            opts[name].zero_grad()
            loss.backward()
            opts[name].step()
        return run

    tr = interleaved({"deepvrm": step(deep, "deepvrm"), "lora": step(lora, "lora")}, warmup=1, repeats=repeats,
                     device=device)
    ratios = {"residual_vs_plain_forward_time": fw["deepvrm"].best / fw["plain"].best,
              "train_step_deepvrm_vs_lora_time": tr["deepvrm"].best / tr["lora"].best}
    rows = [{"what": "plain VLM forward", "seconds": fw["plain"].best},
            {"what": "Deep-VRM forward (V_a + injection)", "seconds": fw["deepvrm"].best},
            {"what": "detection (2 answers scored)", "seconds": det.best},
            {"what": "train step Deep-VRM (stage 2)", "seconds": tr["deepvrm"].best},
            {"what": "train step LoRA only", "seconds": tr["lora"].best}]
    print_table(rows)
    figures = {"images_per_s": batch / det.best, "forward_images_per_s": batch / fw["deepvrm"].best,
               "trainable": {"deepvrm": deep.trainable_parameters(), "lora": lora.trainable_parameters()},
               "threads": torch.get_num_threads(), "wall_s": round(time.perf_counter() - t_start, 1),
               "timing": "best of N, compared functions interleaved round-robin"}
    dev_name = f"{device} ({torch.cuda.get_device_name()})" if device.startswith("cuda") else device
    config = {"batch": batch, "repeats": repeats, "image_size": mcfg.image_size, "inject_layer": mcfg.inject_layer,
              "vlm": dict(mcfg.vlm), "dtype": "float32"}
    write_result(args.out.stem, dev_name, args.quick, ratios, figures, config, results_dir=args.out.parent,
                 goals=GOALS, figures_only=FIGURES_ONLY)


if __name__ == "__main__":
    repeated_main(main)
