"""Deep-VRM's and AutoMoT's exports open with transformers (+ peft) themselves (issue #32, item 3).

Each test builds a tiny model of the real classes (a tiny Qwen2.5-VL base), exports it with ``save_pretrained``,
opens the upstream folder with ``transformers.Qwen2_5_VLForConditionalGeneration`` / ``peft.PeftModel`` and
compares its logits with the workspace's own load of the same folder on the same inputs. The measured maximum
absolute differences are printed (``pytest -s``) for the issue note.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.pretrained import read_card
from core.testing import folder_digest

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "checkpoints"


def _qwen(folder: Path):
    import transformers

    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(folder), local_files_only=True).eval()


def _perturb(module: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Stand-in for fine-tuning: add noise to every floating-point parameter of ``module``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


# -- Deep-VRM ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deepvrm_base(tmp_path_factory):
    from perception.forensics.modeling_deepvrm import tiny_example

    work = tmp_path_factory.mktemp("deepvrm")
    return work / "base", tiny_example(work)


def _deepvrm(base: Path, arm: str):
    from perception.forensics.configuration_deepvrm import DeepVRMModelConfig
    from perception.forensics.modeling_deepvrm import DeepVRM

    config = DeepVRMModelConfig(arm=arm, base_path=str(base), image_size=32, inject_layer=1, lora_rank=2,
                                lora_alpha=4.0, va_lora_rank=2)
    torch.manual_seed(0)  # peft's LoRA A init (and V_a's): reproducible figures
    model = DeepVRM(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # LoRA starts as a no-op (B = 0): make it act; full: move every VLM weight
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05, generator=g)
    if arm == "full":
        _perturb(model.vlm, 2)
    return model.eval()


def _upstream_logits(vlm, model, batch) -> torch.Tensor:
    """The upstream model's logits on the workspace model's batch, with the workspace's own input builder."""
    from core.vlm import patchify, vlm_inputs

    pv, grid = patchify(batch["images"], model.spec)
    with torch.no_grad():
        return vlm(**vlm_inputs(model.vlm, batch["input_ids"], batch["attention_mask"], pv, grid,
                                positions=model.config.positions)).logits


@pytest.mark.parametrize("arm", ["deepvrm", "lora"])
def test_deepvrm_adapter_folder_opens_with_peft(deepvrm_base, tmp_path, arm):
    """``adapter/`` is a peft folder: PeftModel over the base gives the workspace load's logits (deepvrm arm:
    with its residual path off, which is not peft-expressible and stays in model.safetensors)."""
    from peft import PeftModel

    from perception.forensics.modeling_deepvrm import DeepVRM

    base, example = deepvrm_base
    out = _deepvrm(base, arm).save_pretrained(tmp_path / "export", copy_base=True)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "adapter", "base", "config.json",
                                                     "model.safetensors"]
    assert sorted(p.name for p in (out / "adapter").iterdir()) == ["README.md", "adapter_config.json",
                                                                   "adapter_model.safetensors"]
    card = read_card(out)
    assert list(card["upstream"]) == ["adapter"]
    assert ("not peft-expressible" in card["upstream"]["adapter"]) == (arm == "deepvrm")
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == "../base"

    batch = example.inputs()
    ours = DeepVRM.from_pretrained(out)
    ours.residual_on = False
    with torch.no_grad():
        own = ours(**batch).logits
        ours.residual_on = arm == "deepvrm"
        detector = ours(**batch).logits
    upstream = PeftModel.from_pretrained(_qwen(out / "base"), str(out / "adapter")).eval()
    logits = _upstream_logits(upstream, ours, batch)
    diff = (logits - own).abs().max().item()
    print(f"\n[deepvrm arm={arm}] PeftModel(Qwen2_5_VL base, adapter/) vs DeepVRM.from_pretrained "
          f"(residual off): max |logits diff| = {diff:.3g} over {tuple(own.shape)}; vs the detector with its "
          f"residual on: {(logits - detector).abs().max().item():.3g}")
    assert diff <= 1e-6
    with upstream.disable_adapter():  # the adapter's weights are what makes the match
        assert (_upstream_logits(upstream, ours, batch) - own).abs().max().item() > 1e-3
    if arm == "deepvrm":
        assert (logits - detector).abs().max().item() > 1e-4  # V_a's residual is not in the upstream model


def test_deepvrm_adapter_writes_the_exports_weights(deepvrm_base, tmp_path):
    """An export's own state dict (an EMA copy) is what lands in adapter/, tensor for tensor."""
    from core.checkpoint import load_weights

    base, _ = deepvrm_base
    model = _deepvrm(base, "lora")
    ema = {k: v + 0.25 for k, v in model.trained_state_dict().items()}
    out = model.save_pretrained(tmp_path / "export", state_dict=ema)
    adapter = load_weights(out / "adapter" / "adapter_model.safetensors")
    assert len(adapter) == len(ema) > 0
    for key, value in ema.items():
        peft_key = "base_model.model." + key.removeprefix("vlm.").replace(".llm.", ".")
        assert torch.equal(adapter[peft_key], value)
    # referenced, not copied: the adapter config names the base by its absolute path
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base.resolve())


def test_deepvrm_full_arm_exports_a_transformers_folder(deepvrm_base, tmp_path):
    """The full fine-tuning arm: ``vlm/`` (model + tokenizer + processor) opens with the Qwen class alone."""
    import transformers

    from perception.forensics.modeling_deepvrm import DeepVRM

    base, example = deepvrm_base
    out = _deepvrm(base, "full").save_pretrained(tmp_path / "export")
    assert list(read_card(out)["upstream"]) == ["vlm"] and not (out / "adapter").exists()
    batch = example.inputs()
    ours = DeepVRM.from_pretrained(out)
    with torch.no_grad():
        own = ours(**batch).logits
    upstream = _qwen(out / "vlm")
    diff = (_upstream_logits(upstream, ours, batch) - own).abs().max().item()
    print(f"\n[deepvrm arm=full] Qwen2_5_VL.from_pretrained(vlm/) vs DeepVRM.from_pretrained: "
          f"max |logits diff| = {diff:.3g}")
    assert diff <= 1e-6
    assert (_upstream_logits(_qwen(base), ours, batch) - own).abs().max().item() > 1e-3  # not the base's weights
    tok = transformers.AutoTokenizer.from_pretrained(str(out / "vlm"), local_files_only=True)
    assert tok("real or fake")["input_ids"] == ours.tokenizer("real or fake")["input_ids"]


# -- AutoMoT -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def automot_example(tmp_path_factory):
    from driving.automot.modeling_automot import tiny_example

    work = tmp_path_factory.mktemp("automot")
    return work / "base", tiny_example(work)


def test_automot_vlm_folder_opens_with_transformers(automot_example, tmp_path):
    """``vlm/`` holds the fine-tuned understanding expert: the Qwen class's logits equal the workspace load's VLM
    on the same inputs, and its final hidden states equal AutoMoT's understanding stream."""
    import transformers

    from core.vlm import vlm_inputs
    from driving.automot.modeling_automot import DrivingVLA

    base, example = automot_example
    model = example.build().eval()
    _perturb(model.mot.vlm, 3)  # stand-in for the automot arm's fine-tuning of every VLM weight
    out = model.save_pretrained(tmp_path / "export")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "vlm"]
    assert list(read_card(out)["upstream"]) == ["vlm"]

    batch = example.inputs()
    ours = DrivingVLA.from_pretrained(out)
    upstream = _qwen(out / "vlm")
    kw = vlm_inputs(upstream, batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                    batch["image_grid_thw"])
    with torch.no_grad():
        up = upstream(**kw, output_hidden_states=True)
        own = ours.mot.vlm(**kw).logits
        joint = ours(batch).understanding_hidden
        base_logits = _qwen(base)(**kw).logits
    valid = batch["attention_mask"].bool()
    diff = (up.logits - own).abs().max().item()
    stream = (up.hidden_states[-1] - joint)[valid].abs().max().item()
    print(f"\n[automot arm=automot] Qwen2_5_VL.from_pretrained(vlm/) vs DrivingVLA.from_pretrained's VLM: max |logits "
          f"diff| = {diff:.3g}; final hidden vs AutoMoT's understanding stream (joint attention): {stream:.3g}")
    assert diff <= 1e-6
    assert stream <= 1e-5
    assert (base_logits - own).abs().max().item() > 1e-3  # the fine-tuned weights, not the base's
    tok = transformers.AutoTokenizer.from_pretrained(str(out / "vlm"), local_files_only=True)
    assert [tok.convert_tokens_to_ids(t) for t in ours.config.mot.meta_action_names] == \
        list(ours.config.mot.meta_action_token_ids)

    ema = {k: v + 0.5 if k.startswith("mot.vlm.") else v for k, v in model.trained_state_dict().items()}
    again = model.save_pretrained(tmp_path / "ema", state_dict=ema)
    written = _qwen(again / "vlm").state_dict()  # transformers writes its original key names; its load maps back
    assert len(written) > 0 and all(torch.equal(v, ema["mot.vlm." + k]) for k, v in written.items())


def test_automot_frozen_arm_names_its_base(automot_example, tmp_path):
    """The frozen arm writes no second copy of the VLM: its card's upstream entry names the base (unless tokens
    were added to it)."""
    import dataclasses

    from driving.automot.modeling_automot import DrivingVLA

    base, example = automot_example
    config = example.build().config
    frozen = dataclasses.replace(config, arm="frozen", lm_loss_weight=0.0,
                                 mot=dataclasses.replace(config.mot, freeze_understanding=True))
    out = DrivingVLA(frozen).save_pretrained(tmp_path / "export")
    assert not (out / "vlm").exists()
    entry = read_card(out)["upstream"]
    assert list(entry) == ["base"] and str(base.resolve()) in entry["base"]
    # with added tokens the embeddings differ from the base's: then vlm/ is written after all
    added = dataclasses.replace(frozen, added_tokens=list(frozen.mot.meta_action_names))
    policy = DrivingVLA(added)
    out = policy.save_pretrained(tmp_path / "added")
    assert list(read_card(out)["upstream"]) == ["vlm"]
    written = _qwen(out / "vlm").state_dict()
    assert all(torch.equal(v, policy.mot.vlm.state_dict()[k]) for k, v in written.items())


# -- the shipped checkpoints -------------------------------------------------------------------------------------
def test_shipped_checkpoints_load_unchanged_and_re_export_upstream_folders(tmp_path):
    """The shipped deepvrm / automot folders hold no upstream folders (exported before the hook) and load as they
    are; one ``save_pretrained`` of their load writes folders the upstream classes open, with equal logits."""
    from peft import PeftModel

    from core.vlm import vlm_inputs
    from driving.automot.inputs import model_batch
    from driving.automot.modeling_automot import DrivingVLA
    from perception.forensics.configuration_deepvrm import VERDICT_PROMPT
    from perception.forensics.modeling_deepvrm import DeepVRM

    before = {name: folder_digest(ASSETS / name) for name in ("deepvrm", "automot")}
    for name in before:
        assert "upstream" not in read_card(ASSETS / name)
        assert not (ASSETS / name / "adapter").exists() and not (ASSETS / name / "vlm").exists()

    detector = DeepVRM.from_pretrained(ASSETS / "deepvrm")
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    b = detector._batch(images, VERDICT_PROMPT, ["fake", "real"])
    batch = {"images": images, "input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
    detector.residual_on = False
    with torch.no_grad():
        own = detector(**batch).logits
    out = detector.save_pretrained(tmp_path / "deepvrm", copy_base=True)
    upstream = PeftModel.from_pretrained(_qwen(out / "base"), str(out / "adapter")).eval()
    diff = (_upstream_logits(upstream, detector, batch) - own).abs().max().item()
    print(f"\n[shipped deepvrm re-exported] PeftModel(base/, adapter/) vs the shipped detector (residual off, "
          f"text positions): max |logits diff| = {diff:.3g}")
    assert diff <= 1e-6

    policy = DrivingVLA.from_pretrained(ASSETS / "automot")
    g = torch.Generator().manual_seed(0)
    samples = {"images": torch.rand(2, policy.config.history, 3, 64, 64, generator=g),
               "bev": torch.zeros(2, 6, 64, 64), "target_points": torch.randn(2, 4, 2, generator=g),
               "ego": torch.randn(2, 6, generator=g), "instruction": ["Turn left in 30 m.", "Follow the road."]}
    batch = model_batch(samples, policy.prompter, policy.spec)
    kw = vlm_inputs(policy.mot.vlm, batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                    batch["image_grid_thw"])
    out = policy.save_pretrained(tmp_path / "automot")
    with torch.no_grad():
        own = policy.mot.vlm(**kw).logits
        diff = (_qwen(out / "vlm")(**kw).logits - own).abs().max().item()
    print(f"[shipped automot re-exported] Qwen2_5_VL.from_pretrained(vlm/) vs the shipped policy's VLM: "
          f"max |logits diff| = {diff:.3g}")
    assert diff <= 1e-6
    assert {name: folder_digest(ASSETS / name) for name in before} == before  # read only
