#!/usr/bin/env bash
# The README's main command: install what answering needs (the 'answer' profile: no torch stack, no test
# tools) from the lock and the embedded models, then answer 5 GSM8K and 5 MMLU-STEM questions offline with
# the embedded conductor over the embedded local pool. PYTHON=/path/to/venv/bin/python installs into and runs
# from that environment.
set -euo pipefail
cd "$(dirname "$0")/.."
export PREFECT_SERVER_ANALYTICS_ENABLED=false
bash infra/install.sh --profile answer
# At most 3 steps per workflow keeps the small local pool to a few minutes on 2 cores (the paper allows 5).
"${PYTHON:-python}" -m conductor answer "${QUESTIONS:-gsm8k_test:5,mmlu_stem:5}" --out "${OUT:-runs/quickstart}" --max-steps 3 "$@"
