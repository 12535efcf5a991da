#!/usr/bin/env bash
# One prepared pass of the GPU checks (a lent CUDA machine, bare image with torch / transformers / peft /
# timm / h5py but not this project's other pins): the full (non --quick) benchmarks of the built methods
# in bf16 autocast on CUDA, the DeviceLoader CUDA test, then the summary table.
#
#   bash benchmarks/gpu_session.sh OUT_DIR [NAME:CAP_S ...]   # OUT_DIR gets results.tgz (benchmarks/results)
#
# Without NAME:CAP_S pairs every benchmark below runs (and benchmarks/results starts empty); with them only
# those run, adding to the results already there (a rerun of the ones a first pass lost).
#
# Paper size (benchmarks/paper_scale.py: each method at its paper's size, one bf16 training step + one
# inference, peak memory / step time / MFU): NAME `paper_scale.METHOD` runs that method's row alone in its own
# process under its cap (rows merge into benchmarks/results/paper_scale.json); the word `paper` stands for
# every method's row with the caps below. The paper rows alone take about 8 minutes of an H200, so they are not
# in the default pass (its caps already sum to ~7.5 minutes of a 10-minute command); run them as their own call:
#   bash benchmarks/gpu_session.sh OUT paper                      # or: ... OUT paper_scale.deepvrm:150
#
# Video (the word `video`): benchmarks.flexforcing (the sampling regimes of the shipped-size Flex-Forcing on the
# Wan classes; ~2.5 minutes of an H200: launch-bound, the no-cache AR baseline alone runs 512 passes a call) and
# benchmarks.flexforcing_mask (dense SDPA mask vs FlexAttention block mask at 21 / 81 latent frames of Wan2.1's
# 480p layout: mask bytes, build and attention peaks, times; FlexAttention compiles once per shape). Not in the
# default pass (it would not fit the command); run them as their own call:
#   bash benchmarks/gpu_session.sh OUT video                      # or: ... OUT flexforcing_mask:240
#
# Missing pure-Python pins travel as wheels in .whl/ (see ../.library/device/README.md); they are installed
# to /tmp/site first. Each benchmark runs under its own time cap so that one slow or failing benchmark
# cannot cost the others; results are re-packed after each one, so a cut-off run still returns what it
# measured.
set -u
out=${1:?usage: gpu_session.sh OUT_DIR}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
# the methods register through the `embodied.methods` entry points of the installed package; the image has
# the source tree only, so publish those entry points from pyproject.toml as a bare dist-info
mkdir -p /tmp/site && python3 - <<'PY'
import pathlib, tomllib
eps = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["entry-points"]
d = pathlib.Path("/tmp/site/embodied_workspace-0.0.0.dist-info"); d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text("Metadata-Version: 2.1\nName: embodied-workspace\nVersion: 0.0.0\n")
(d / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in m.items()) + "\n"
                                            for g, m in eps.items()))
PY
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD}
export PYTHONUNBUFFERED=1 BENCH_DTYPE=${BENCH_DTYPE:-auto} TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
shift
# per-method caps of the paper-size rows: building the model on the GPU, two training steps (the counted warm-up
# and the timed one) and two inferences; the 7B / 4B VLMs and Wan2.1-1.3B over 32,760 tokens (21 latent frames at
# 480 x 832; inference: 31 flex passes + the 3-D VAE decoding 81 frames) take longest
paper="paper_scale.transnormal:60 paper_scale.deepvrm:90 paper_scale.automot:90 paper_scale.flexforcing:120
paper_scale.tagrpo:90 paper_scale.fera:40 paper_scale.sola:30 paper_scale.lacwm:20 paper_scale.bc:20"
video="flexforcing:150 flexforcing_mask:210"
specs=${*:-"sola:90 transnormal:90 loaders:50 fera:60 tagrpo:40 deepvrm:40 worldmodel:30"}
expanded=""
for spec in $specs; do  # `paper` (or a bare paper_scale[:CAP]) = every paper-size row, each under its own cap
  case $spec in
    paper | paper_scale | paper_scale:*) expanded="$expanded $paper" ;;
    video) expanded="$expanded $video" ;;
    *) expanded="$expanded $spec" ;;
  esac
done
specs=$expanded
pack() { tar czf "$out/results.tgz" benchmarks/results 2>/dev/null; }
mkdir -p benchmarks/results
if [ $# -eq 0 ]; then
  rm -rf benchmarks/results/*
  echo "== tests/core/data/test_device.py (CUDA path)"
  timeout 60 python3 -m pytest -q -p no:cacheprovider -k cuda tests/core/data/test_device.py 2>&1 | tail -4
fi
for spec in $specs; do
  b=${spec%%:*}; cap=${spec##*:}; t0=$(date +%s)
  echo "== benchmarks.$b (cap ${cap}s)"
  if [[ $b == paper_scale.* ]]; then  # one paper-size row; on a cut-off the row is missing, the others stay
    timeout "$cap" python3 -m benchmarks.paper_scale --methods "${b#paper_scale.}" 2>&1 \
      | grep -v -E "Warning|warn\(" | tail -16 || true
  else
    timeout "$cap" python3 -m benchmarks."$b" 2>&1 | grep -v -E "Warning|warn\(" | tail -25 || true
  fi
  echo "-- $b took $(( $(date +%s) - t0 )) s"; pack
done
python3 -m benchmarks.summary
pack
