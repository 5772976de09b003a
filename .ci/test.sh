#!/usr/bin/env bash
# The test suite (`make test`): every test, root ones included; pytest prints its counts.
# Two pytest runs side by side: the Kubernetes e2e (tests/e2e/kube, one cluster at a time, mostly
# waiting on the API server and kubelets) and everything else (the two share no lab, namespace or
# OVS instance: each names its own). Together they take about what the longer one takes alone.
# FERRY_TEST_SERIAL=1 runs them one after the other instead.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${FERRY_VENV:-$PWD/.venv}
export FERRY_CNI_BIN=${FERRY_CNI_BIN:-$PWD/build/cni-bin}
export CNITOOL=${CNITOOL:-$PWD/build/tools/cnitool}
"$venv/bin/ruff" check cni routesync lab bench tests || exit 1
"$venv/bin/mypy" cni routesync tests/routesync/standins.py tests/routesync/test_standins.py || exit 1
pytest=("$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=40)
if [ "$#" -gt 0 ] || [ "${FERRY_TEST_SERIAL:-}" = 1 ]; then
    "${pytest[@]}" tests "$@"
    exit $?  # pytest's 5 ("no tests collected"): a suite that ran nothing has failed
fi
logs=build/test-logs
mkdir -p "$logs"
"${pytest[@]}" tests/e2e/kube >"$logs/kube.log" 2>&1 &
kube=$!
"${pytest[@]}" tests --ignore=tests/e2e/kube
rest=$?
wait "$kube"
kube_rc=$?
echo "=== tests/e2e/kube (ran beside the rest; $logs/kube.log) ==="
cat "$logs/kube.log"
echo "=== exit: tests/e2e/kube $kube_rc, the rest $rest ==="
[ "$rest" = 0 ] && [ "$kube_rc" = 0 ]
