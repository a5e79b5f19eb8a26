#!/usr/bin/env bash
# The README's test command: install the locked dependency set (dev extras included) and the smallest
# embedded model, then run the test suite. Slow real-model tests are skipped unless CONDUCTOR_RUN_SLOW=1.
set -euo pipefail
cd "$(dirname "$0")/.."
export PREFECT_SERVER_ANALYTICS_ENABLED=false
bash infra/install.sh --models smollm2-135m-instruct
python -m pytest -q -p no:cacheprovider "$@"
