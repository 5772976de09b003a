#!/usr/bin/env bash
# The test suite (`make test`): every test, root ones included; pytest prints its counts.
# Two pytest runs side by side: the Kubernetes e2e (tests/e2e/kube, one cluster at a time, mostly
# waiting on the API server and kubelets) and everything else, then the upstream suites' runs (the
# two share no lab, namespace or OVS instance: each names its own). Together they take about what
# the longer one takes alone.
# FERRY_TEST_SERIAL=1 runs them one after the other instead.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${FERRY_VENV:-$PWD/.venv}
export FERRY_CNI_BIN=${FERRY_CNI_BIN:-$PWD/build/cni-bin}
export CNITOOL=${CNITOOL:-$PWD/build/tools/cnitool}
"$venv/bin/ruff" check cni routesync controller lab bench tests || exit 1
"$venv/bin/mypy" cni routesync controller tests/controller tests/routesync/standins.py tests/routesync/test_standins.py || exit 1
pytest=("$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=40)
if [ "$#" -gt 0 ] || [ "${FERRY_TEST_SERIAL:-}" = 1 ]; then
    "${pytest[@]}" tests "$@"
    exit $?  # pytest's 5 ("no tests collected"): a suite that ran nothing has failed
fi
logs=build/test-logs
mkdir -p "$logs"
# The two upstream suites' runs (e2e's ci suite, ~8 min; network-policy-api's, ~10 min) go after the
# rest, in its lane, each on a cluster of its own: the Kubernetes lane alone would take ~63 min.
upstream=(tests/e2e/kube/test_conformance.py
          tests/e2e/kube/test_kube_policy.py::test_the_cluster_network_policy_conformance_suite)
"${pytest[@]}" tests/e2e/kube --ignore="${upstream[0]}" --deselect="${upstream[1]}" >"$logs/kube.log" 2>&1 &
kube=$!
"${pytest[@]}" tests --ignore=tests/e2e/kube
rest=$?
"${pytest[@]}" "${upstream[@]}"
up=$?
wait "$kube"
kube_rc=$?
echo "=== tests/e2e/kube but the upstream suites (ran beside the rest; $logs/kube.log) ==="
cat "$logs/kube.log"
echo "=== exit: tests/e2e/kube $kube_rc, the rest $rest, the upstream suites $up ==="
[ "$rest" = 0 ] && [ "$kube_rc" = 0 ] && [ "$up" = 0 ]
