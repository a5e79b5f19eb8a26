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
QUESTIONS="${QUESTIONS:-gsm8k_test:5,mmlu_stem:5}"
OUT="${OUT:-runs/quickstart}"
"${PYTHON:-python}" -m conductor answer "$QUESTIONS" --out "$OUT" --max-steps 3 "$@"
# How that run compares with each language-model worker alone on the same questions (COMPARE=0 skips this):
# the single-worker baselines run through the same pipeline into the same lake; the conductor's run is read
# back from the lake (same run id), not redone. Prints accuracy ± s.e., seconds per question, a paired test.
if [ "${COMPARE:-1}" != "0" ]; then
  "${PYTHON:-python}" -m conductor compare "$QUESTIONS" --out "$OUT/compare" --lake "$OUT/lake" \
    --cache "$OUT/cache.sqlite" --strategies conductor,fixed:0,fixed:1,fixed:2 --max-steps 3
fi
