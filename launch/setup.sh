#!/usr/bin/env bash
# launch/setup.sh -- install what kiln needs, configure, build, then optionally run.
#
#   bash launch/setup.sh            set up and build only
#   bash launch/setup.sh train ...  set up, build, then `kiln train ...` (the default run)
#   bash launch/setup.sh test ...   set up, build, then the test suite (`ctest ...`)
#
# Idempotent and fast when nothing is missing: each step checks before it acts.
#   1. Debian packages (Open MPI, cxxopts, nlohmann-json, GoogleTest, ninja, ccache, iproute2 for
#      the simulated nodes of tests/multinode).
#   2. The pinned torch wheel in a project-local virtual environment (.venv), whose LibTorch
#      kiln builds against (set KILN_TORCH_PREFIX to use another LibTorch instead), and beside it
#      transformers and safetensors (tests), matplotlib (kiln report), tokenizers (BPE) and
#      tensorboard (a test reads kiln's event files with it).
#   3. CMake configure (once) and build into build/ (KILN_BUILD_DIR overrides).
# Environment: KILN_JOBS (parallel build jobs, default: cores), KILN_CMAKE_ARGS (extra args).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
torch_pin="2.11.0"
venv="${KILN_VENV:-$root/.venv}"
build="${KILN_BUILD_DIR:-$root/build}"
jobs="${KILN_JOBS:-$(nproc)}"
say() { echo "[setup] $*" >&2; }

# ---- 1. Debian packages --------------------------------------------------------------------
pkgs=(cmake g++ ninja-build ccache libopenmpi-dev openmpi-bin libcxxopts-dev nlohmann-json3-dev libgtest-dev iproute2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ! python3 -m venv --help >/dev/null 2>&1; then missing+=(python3-venv); fi
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- 2. LibTorch from the pinned torch wheel -----------------------------------------------
if [ -n "${KILN_TORCH_PREFIX:-}" ]; then
  torch_prefix="$KILN_TORCH_PREFIX"
else
  have=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
  if [ "${have%%+*}" != "$torch_pin" ]; then
    say "installing torch==$torch_pin into $venv (found: ${have:-none}); this downloads a few GB once"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_pin"
  fi
  # transformers + safetensors: only the test that loads kiln's checkpoints with Hugging Face's
  # GPT2LMHeadModel (tests/hf, label cli) uses them; ~25 s and ~240 MB once, with numpy, tokenizers...
  # matplotlib: `kiln report`'s plotting (tools/report.py); ~10 s and ~40 MB once.
  # tokenizers: BPE encoding for `kiln prep --tokenizer` and `kiln sample` (tools/bpe_tokenizer.py);
  # transformers depends on it, pinned here because kiln calls it itself.
  # tensorboard: only tests/cli/tensorboard.sh, which reads kiln's event files back with it.
  hf_pins="transformers==5.23.0 safetensors==0.8.0 matplotlib==3.11.2 tokenizers==0.23.3 tensorboard==2.21.0"
  have_hf=$("$venv/bin/python" -c 'import transformers, safetensors, matplotlib, tokenizers, tensorboard; print(f"transformers=={transformers.__version__} safetensors=={safetensors.__version__} matplotlib=={matplotlib.__version__} tokenizers=={tokenizers.__version__} tensorboard=={tensorboard.__version__}")' 2>/dev/null || true)
  if [ "$have_hf" != "$hf_pins" ]; then
    say "installing $hf_pins into $venv (found: ${have_hf:-none})"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q --disable-pip-version-check $hf_pins
  fi
  torch_prefix=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
fi

# ---- 3. configure and build ----------------------------------------------------------------
if [ ! -f "$build/CMakeCache.txt" ]; then
  # ccache (installed above) is wired by CMake itself, with the settings that make it cache
  # (cmake/KilnCompilerCache.cmake).
  say "configuring $build"
  # shellcheck disable=SC2086
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DKILN_PYTHON="$venv/bin/python" ${KILN_CMAKE_ARGS:-} >/dev/null
fi
# `train` builds the kiln binary alone; `build` and `test` build everything, the tests included.
action="${1:-build}"
[ $# -gt 0 ] && shift
case "$action" in build|train|test) ;; *) echo "setup: unknown action '$action' (use: build, train, test)" >&2; exit 2 ;; esac
targets=()
[ "$action" = train ] && targets=(--target kiln)
say "building ${targets[*]:-everything} ($jobs jobs)"
cmake --build "$build" -j "$jobs" "${targets[@]}"

# ---- 4. run --------------------------------------------------------------------------------
case "$action" in
  build) ;;
  train) exec "$build/kiln" train "$@" ;;
  test)
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
      say "no CUDA GPU on this machine: tests labelled 'gpu' will be skipped (reported as Skipped below)"
    fi
    cd "$build" && exec ctest --output-on-failure --timeout 900 -j "$jobs" "$@" ;;
  *) echo "setup: unknown action '$action' (use: build, train, test)" >&2; exit 2 ;;
esac
