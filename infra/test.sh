#!/usr/bin/env bash
# The README's test command: install the whole locked dependency set (the 'all' profile: training stack and
# dev extras included) and the smallest embedded model, then run the test suite. Slow real-model tests are
# skipped unless CONDUCTOR_RUN_SLOW=1. Extra arguments go to pytest (e.g. `bash infra/test.sh tests/test_lake_atomic.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PREFECT_SERVER_ANALYTICS_ENABLED=false
bash infra/install.sh --profile all --models smollm2-135m-instruct
"${PYTHON:-python}" -m ruff check .          # lint (configuration: [tool.ruff] in pyproject.toml); fails the run
"${PYTHON:-python}" -m mypy                   # types of conductor/, flows/, tasks/ ([tool.mypy]); fails the run
# The suite on every core (pytest-xdist; TEST_WORKERS=0 runs it in this process): each test file stays on one
# worker (--dist loadfile), so a file's module fixtures (a Prefect server, a compare run) start once.
# (pytest-benchmark, in the lock but used by no test, would warn that xdist disables it: -p no:benchmark.)
"${PYTHON:-python}" -m pytest -q -p no:cacheprovider -p no:benchmark -n "${TEST_WORKERS:-auto}" --dist loadfile "$@"
