"""The lab on the frozen bundle: ``install-cni`` output is the CNI_PATH and route-sync is the
installed bundle's own ``ferry-route-sync`` (with metrics on); the connectivity matrix passes and
a Node's /metrics, /readyz answer from inside its namespace."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.ship.helpers import host_bin_dir, run

pytestmark = [pytest.mark.root, pytest.mark.slow]
METRICS_PORT = 9469
SCRAPE = """
import sys, urllib.request, urllib.error
for path in sys.argv[2:]:
    try:
        r = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}{path}", timeout=5); code, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        code, body = e.code, e.read()
    print(f"=== {path} {code}"); print(body.decode())
"""


def test_lab_on_the_installed_frozen_bundle(bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from lab import check
    from lab.api import Lab
    from tests.support.labs import PODS, can_run, topology

    bin_dir = host_bin_dir(tmp_path / "bin")
    run([str(bundle / "ferry-route-sync"), "install-cni", "--cni-bin-dir", str(bin_dir),
         "--cni-conf-dir", str(tmp_path / "net.d"), "--cni-version", "1.0.0"])
    installed = os.path.realpath(bin_dir / "ferry")
    assert str(bundle) not in installed  # the copy, not the build dir
    monkeypatch.setenv("FERRY_ROUTE_SYNC", os.path.join(os.path.dirname(installed), "ferry-route-sync"))
    monkeypatch.setenv("FERRY_METRICS_PORT", str(METRICS_PORT))
    reason = can_run()
    if reason:
        pytest.skip(reason)
    name = f"sp8{os.getpid() % 100000:x}"[:12]
    lab = Lab.up(topology({"trafficEncapMode": "encap", "tunnelType": "vxlan"}), name=name, cni_bin=str(bin_dir))
    try:
        assert lab.route_sync
        for node in lab.nodes:  # route-sync runs from the installed bundle
            pid = lab.route_sync_pid(node.name)
            assert pid is not None
            assert os.path.dirname(installed) in Path(f"/proc/{pid}/cmdline").read_text()
        for node, pod in PODS:
            lab.add_pod(node, pod)
        rows = check.run(lab)
        failed = [r for r in rows if not r.ok]
        assert rows and not failed, check.table(lab, failed)

        n1 = lab.node("node-1")
        out = n1.exec([sys.executable, "-I", "-S", "-c", SCRAPE, str(METRICS_PORT), "/metrics", "/readyz", "/healthz"],
                      check=True).stdout
        parts = {chunk.split("\n", 1)[0]: chunk.split("\n", 1)[1] for chunk in out.split("=== ")[1:]}
        assert "/readyz 200" in parts and "/healthz 200" in parts, list(parts)
        metrics_text = parts["/metrics 200"]
        s = {(x.name, tuple(sorted(x.labels.items()))): x.value
             for fam in text_string_to_metric_families(metrics_text) for x in fam.samples}
        assert s[("ferry_route_sync_peers", (("family", "4"), ("path", "tunnel")))] == 2
        assert s[("ferry_route_sync_peers", (("family", "6"), ("path", "tunnel")))] == 2
        assert s[("ferry_route_sync_last_reconcile_success", ())] == 1
        assert s[("ferry_route_sync_reconcile_duration_seconds_count", ())] >= 1
        assert ("ferry_route_sync_node_change_to_applied_seconds_count", ()) in s
        assert ("ferry_route_sync_mac_source_disagreements_total", ()) in s
    finally:
        lab.down()
