#!/usr/bin/env bash
# The test suite (`make test`): every test, root ones included; pytest prints its count.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${FERRY_VENV:-$PWD/.venv}
export FERRY_CNI_BIN=${FERRY_CNI_BIN:-$PWD/build/cni-bin}
export CNITOOL=${CNITOOL:-$PWD/build/tools/cnitool}
"$venv/bin/ruff" check cni ipam routesync lab bench tests || exit 1
"$venv/bin/mypy" cni ipam routesync tests/routesync/standins.py tests/routesync/test_standins.py || exit 1
"$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=40 tests "$@"
rc=$?
# pytest's 5 means "no tests collected": a suite that ran nothing has failed.
exit $rc
