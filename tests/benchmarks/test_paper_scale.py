"""``benchmarks.paper_scale``: every method's row at ``--tiny`` on the CPU, the FLOP counter and the MFU table.

The paper-size rows need a GPU (``benchmarks/gpu_session.sh``); here the same code path runs with shrunk widths.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from benchmarks import paper_scale as ps


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper_scale") / "paper_scale.json"
    ps.main(["--tiny", "--device", "cpu", "--out", str(out)])
    return json.loads(out.read_text())


@pytest.mark.slow  # builds all nine methods (~40 s of CPU); the rows' logic is covered below on three cheap ones
def test_tiny_run_has_every_method_measured(tiny_run):
    rec = tiny_run
    assert rec["name"] == "paper_scale" and rec["device"] == "cpu" and rec["quick"] is True
    rows = {r["method"]: r for r in rec["figures"]["rows"]}
    assert list(rows) == list(ps.METHODS)
    for m, r in rows.items():
        assert r["status"] == "ok", f"{m}: {r['status']}\n{r.get('traceback', '')}"
        assert r["parameters"] > 0 and 0 < r["trainable_parameters"] <= r["parameters"], m
        for key in ("train_step_s", "infer_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (m, key, r[key])
        assert r["train_flops"] > 0 and r["infer_flops"] > 0, m
        assert 0 <= r["train_recompute_flops"] < r["train_flops"], m
        assert r["train_model_flops"] == r["train_flops"] - r["train_recompute_flops"], m
        assert "train_peak_memory_bytes" in r and "infer_peak_memory_bytes" in r, m
        assert r["train_mfu"] is None and r["infer_mfu"] is None, f"{m}: MFU on a CPU"  # CUDA only
        assert r["infer_vs_train_time"] == pytest.approx(r["infer_s"] / r["train_step_s"]), m
        assert rec["ratios"][f"{m}_infer_vs_train_time"] == pytest.approx(r["infer_vs_train_time"])
        assert f"{m}_train_mfu" not in rec["ratios"]
        if r["checkpointing"]:  # the recompute of torch.utils.checkpoint is told apart from the model's FLOPs
            assert r["train_recompute_flops"] > 0, m
    assert rows["deepvrm"]["checkpointing"], "the 7B's row runs with gradient checkpointing"
    assert rec["figures"]["peak_flops"] is None


def test_rows_of_a_later_run_merge_into_the_file(tmp_path):
    out = tmp_path / "paper_scale.json"
    ps.main(["--tiny", "--device", "cpu", "--methods", "bc", "--out", str(out)])
    ps.main(["--tiny", "--device", "cpu", "--methods", "sola,bc", "--out", str(out)])
    rows = json.loads(out.read_text())["figures"]["rows"]
    assert [r["method"] for r in rows] == ["sola", "bc"]  # bc replaced, in METHODS order


def _mlp(checkpointed: bool) -> nn.Module:
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            def body(t):
                return self.b(torch.relu(self.a(t)))

            return checkpoint(body, x, use_reentrant=False) if checkpointed else body(x)

    torch.manual_seed(0)
    return Net()


def test_flop_counter_tells_recompute_apart():
    x = torch.randn(5, 8)
    counts = {}
    for ckpt in (False, True):
        net = _mlp(ckpt)
        with ps.StepFlopCounter() as c:
            net(x).sum().backward()
        counts[ckpt] = (c.get_total_flops(), c.recompute_flops)
    fa, fb = 2 * 5 * 8 * 16, 2 * 5 * 16 * 4  # the two layers' forward matmuls (2 FLOPs a multiply-add)
    forward = fa + fb
    # backward: b's input and weight gradients, a's weight gradient only (x needs no gradient)
    assert counts[False] == (forward + 2 * fb + fa, 0)
    # checkpointed: the recompute is counted as such; torch stops it once the tensors backward needs are back
    # (b's input, the relu output), so b's matmul is not redone
    assert counts[True] == (counts[False][0] + fa, fa)


def test_peak_table_and_override(monkeypatch):
    monkeypatch.delenv("BENCH_PEAK_TFLOPS", raising=False)
    assert ps.peak_flops("cpu")[0] is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert ps.peak_flops("cuda")[0] == 989e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 PCIe")
    assert ps.peak_flops("cuda")[0] == 756e12  # the longer key wins over "H100"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Future GPU")
    assert ps.peak_flops("cuda")[0] is None
    monkeypatch.setenv("BENCH_PEAK_TFLOPS", "100")
    assert ps.peak_flops("cpu") == (100e12, "BENCH_PEAK_TFLOPS")


def test_mfu_when_a_peak_is_known_and_failing_rows_do_not_stop_the_others(monkeypatch, tmp_path):
    ctx = ps.Ctx(tiny=True, device="cpu", dtype="float32", workdir=tmp_path)
    row = ps.run_method("bc", ctx, peak=1e12)
    assert row["train_mfu"] == pytest.approx(row["train_model_flops"] / row["train_step_s"] / 1e12)
    assert row["infer_mfu"] == pytest.approx(row["infer_flops"] / row["infer_s"] / 1e12)

    def missing(ctx):
        raise ModuleNotFoundError("No module named 'flash_attn'", name="flash_attn")

    def oom(ctx):
        case = ps.bc(ctx)
        case.infer = lambda: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried ..."))
        return case

    monkeypatch.setitem(ps.BUILDERS, "sola", missing)
    monkeypatch.setitem(ps.BUILDERS, "lacwm", oom)
    out = tmp_path / "paper_scale.json"
    ps.main(["--tiny", "--device", "cpu", "--methods", "sola", "lacwm", "bc", "--out", str(out)])
    rows = {r["method"]: r for r in json.loads(out.read_text())["figures"]["rows"]}
    assert rows["sola"]["status"] == "build missing dependency: flash_attn"
    assert rows["lacwm"]["status"].startswith("infer OOM: CUDA out of memory")
    assert rows["lacwm"]["train_step_s"] > 0  # its training step was still measured
    assert rows["bc"]["status"] == "ok"


def test_flexforcing_row_is_wan21_1_3b_on_the_meta_device():
    from core.layers.vae import wan21_vae_size
    from core.layers.wan import WAN21_1_3B, wan_parameter_count

    sizes = ps.flexforcing_sizes()
    assert sizes["transformer"] == 1_418_996_800 == wan_parameter_count(WAN21_1_3B)  # Wan2.1-T2V-1.3B exactly
    # the K-projection: per block Linear(1536 -> 12 heads x (1 + 2 x 128)), weights and biases
    assert sizes["kproj"] == 30 * (1536 + 1) * 12 * (1 + 2 * 128)
    assert sizes["vae"] == wan21_vae_size()
    assert sizes["frame_hw"] == [480, 832] and sizes["latent_hw"] == [60, 104] and sizes["latent_channels"] == 16
    assert (sizes["latent_frames"], sizes["video_frames"]) == (21, 81)
    assert (sizes["tokens_per_frame"], sizes["tokens"]) == (1560, 32760)


@pytest.mark.parametrize("method", ["flexforcing", "tagrpo"])
def test_video_rows_run_at_tiny_size(method, tmp_path):
    ctx = ps.Ctx(tiny=True, device="cpu", dtype="float32", workdir=tmp_path)
    row = ps.run_method(method, ctx, peak=None)
    assert row["status"] == "ok", f"{row['status']}\n{row.get('traceback', '')}"
    assert row["train_step_s"] > 0 and row["infer_s"] > 0 and row["train_flops"] > 0
    assert 0 < row["trainable_parameters"] <= row["parameters"]
