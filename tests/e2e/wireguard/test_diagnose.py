"""The encrypted suites' failure diagnostics (:mod:`tests.e2e.wireguard.diagnose`) carry what they
promise, and never raise:

* a pair broken on purpose (node-3's device forgets node-1's key: route-sync puts it back only at its
  next full pass, 60 s on) fails its probes, and the failure's text has every Node's WireGuard peers
  (endpoint, handshake, counters), the second probe's verdict (still lost), neighbours, routes, OVS's
  tunnel neighbours, route-sync's log and the router's neighbours, also in the file it names;
* on a lab with nothing behind it (no namespace, no device, no file), or one whose every part raises,
  it still returns text and says what it could not collect."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cni.pipeline.modes import ENCRYPTION_WIREGUARD
from lab import check, topology
from lab.api import Lab
from routesync.config import WireGuardConfig
from routesync.wireguard.model import PeerChange, WgChange
from routesync.wireguard.uapi import Uapi
from tests.e2e.wireguard import diagnose
from tests.e2e.wireguard.helpers import mode, mode_doc, published_keys, settle_encrypted, start

WG = WireGuardConfig().interface


def _idle_lab(where: Path) -> Lab:
    doc = mode_doc(mode("encap-vxlan"), ENCRYPTION_WIREGUARD)
    return Lab("twdiagnone", topology.parse(doc), str(where / "lab"), str(where / "bin"), None)


def test_diagnostics_of_a_lab_with_nothing_behind_it_still_say_something(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(diagnose.DIR_ENV, str(tmp_path / "out"))
    lab = _idle_lab(tmp_path)
    text = diagnose.diagnose(lab, [diagnose.Pair("node-1/a", "node-3/a", "10.244.3.2")], "nothing there")
    assert "device not readable" in text and "no such source now" in text, text
    assert "--- node-3" in text and "--- router" in text, text
    [written] = os.listdir(tmp_path / "out")
    assert f"(also in {tmp_path / 'out' / written})" in text

    def boom(self: Lab) -> list:
        raise RuntimeError("every part raises")

    monkeypatch.setattr(Lab, "nodes", property(boom))
    text = diagnose.diagnose(lab, what="nothing there")
    assert "diagnostics of lab twdiagnone failed" in text and "every part raises" in text, text


@pytest.mark.root
def test_a_pair_broken_on_purpose_explains_itself(cni_bin: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(diagnose.DIR_ENV, str(tmp_path))
    lab = start(cni_bin, mode("encap-vxlan"), ENCRYPTION_WIREGUARD,
                (("node-1", "a"), ("node-2", "a"), ("node-3", "a")), family="6")
    try:
        settle_encrypted(lab)
        key1 = published_keys(lab)["node-1"]
        assert key1
        Uapi(lab.node("node-3").paths.wireguard_run).configure(WG, WgChange(peers=(PeerChange(key1, remove=True),)))
        rows = check.run(lab, ("other-subnet",))
        failed = [r for r in rows if not r.ok]
        assert {(r.spec.src, r.spec.dst) for r in failed} == {("node-1/a", "node-3/a")}, check.table(lab, rows)
        text = diagnose.explain(lab, rows, "broken on purpose")
        print(f"\n{text}")
    finally:
        lab.down()
    assert "1 FAILED" in text or "2 FAILED" in text, text
    for want in ("WireGuard peers (wireguard-go's UAPI) at the failure", "-> node-3: endpoint [fd00:88::",
                 "handshake ", "rx ", "second probe", "node-1/a -> node-3/a", "still lost (lasting)",
                 "# ip -4 neigh", "# ip -6 neigh", "# ip -6 route", "# ovs-appctl tnl/neigh/show",
                 "# route-sync log", "--- router", "fd00:77::"):
        assert want in text, f"{want!r} not in:\n{text}"
    # node-3's device no longer lists node-1; node-1's still lists node-3
    at_failure = text.split("at the failure:\n", 1)[1].split("second probe", 1)[0]
    n3 = at_failure.split("  node-3 (", 1)[1]
    assert "-> node-2" in n3 and "-> node-1" not in n3, at_failure
    path = text.rsplit("(also in ", 1)[1].rstrip(")")
    assert Path(path).read_text().startswith("=== diagnostics of lab"), path
