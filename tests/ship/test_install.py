"""install-cni in temp dirs: the conflist it renders, idempotence, stale confs, links, uninstall.

A source-tree bundle stands in for the frozen one here (``python -m cni.launcher`` writes
``ferry``/``ferry-ipam``); the frozen bundle through cnitool is in test_install_cnitool.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from routesync import install
from tests.ship.helpers import ROOT


@pytest.fixture
def fake_bundle(tmp_path: Path) -> Path:
    d = tmp_path / "bundle"
    subprocess.run([sys.executable, "-m", "cni.launcher", str(d)], cwd=ROOT, check=True, capture_output=True)
    for p in list(d.iterdir()):  # keep only ours: a bundle has no reference plugins
        if p.is_symlink():
            p.unlink()
    (d / "_internal").mkdir()
    (d / "_internal" / "lib.so").write_bytes(b"\x7fELF fake")
    return d


def versions(supported: dict[str, tuple[str, ...]]):
    return lambda path: supported.get(os.path.basename(path), ())


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_render_orders_ferry_then_chained_and_merges_ipam() -> None:
    t = install.load_templates()
    doc = install.render_conflist(t, "1.0.0", ["bandwidth", "portmap"],
                                  {"logFile": "/x.log", "ipam": {"ranges": [[{"subnet": "10.1.0.0/24"}]]}})
    assert doc["cniVersion"] == "1.0.0" and doc["name"] == "ferry"
    assert [p["type"] for p in doc["plugins"]] == ["ferry", "portmap", "bandwidth"]
    ferry = doc["plugins"][0]
    assert ferry["logFile"] == "/x.log"
    assert ferry["ipam"] == {"type": "ferry-ipam", "dataDir": "/var/lib/ferry/ipam",
                             "ranges": [[{"subnet": "10.1.0.0/24"}]]}
    assert doc["plugins"][1]["capabilities"] == {"portMappings": True}
    assert doc["plugins"][2]["capabilities"] == {"bandwidth": True}
    assert t["ferry"].get("logFile") == "/var/log/ferry/cni.log"  # the template is not mutated


def test_render_rejects_unknown_version_and_type_override() -> None:
    t = install.load_templates()
    with pytest.raises(install.InstallError, match="0.3.1"):
        install.render_conflist(t, "0.3.1", [])
    with pytest.raises(install.InstallError, match="type"):
        install.render_conflist(t, "1.1.0", [], {"type": "bridge"})


def test_chains_only_present_plugins_supporting_the_version(tmp_path: Path) -> None:
    executable(tmp_path / "portmap")
    executable(tmp_path / "bandwidth")
    sup = versions({"portmap": ("0.4.0", "1.0.0"), "bandwidth": ("0.4.0", "1.0.0", "1.1.0")})
    chained, notes = install.chainable(str(tmp_path), "1.1.0", sup)
    assert chained == ["bandwidth"] and len(notes) == 1 and "portmap" in notes[0]
    assert install.chainable(str(tmp_path), "1.0.0", sup)[0] == ["portmap", "bandwidth"]
    (tmp_path / "bandwidth").unlink()
    assert install.chainable(str(tmp_path), "1.0.0", sup)[0] == ["portmap"]


def test_real_reference_plugins_answer_version() -> None:
    if not os.access("/usr/lib/cni/portmap", os.X_OK):
        pytest.skip("containernetworking-plugins not installed")
    vs = install.supported_versions("/usr/lib/cni/portmap")
    assert "0.4.0" in vs and "1.0.0" in vs


def test_install_is_idempotent_and_uninstall_removes_what_it_wrote(fake_bundle: Path, tmp_path: Path) -> None:
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    bin_dir.mkdir()
    conf_dir.mkdir()
    executable(bin_dir / "portmap")
    (conf_dir / "05-other.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "bridge"}]}))
    (conf_dir / "20-ferry-old.conflist").write_text(json.dumps(
        {"cniVersion": "0.4.0", "name": "ferry", "plugins": [{"type": "ferry"}]}))
    (conf_dir / "30-ferry.conf").write_text(json.dumps({"cniVersion": "0.4.0", "name": "f", "type": "ferry"}))
    before_bin = set(os.listdir(bin_dir))
    sup = versions({"portmap": ("1.0.0", "1.1.0")})

    plan = install.plan_install(str(fake_bundle), str(bin_dir), str(conf_dir), "1.1.0", versions_of=sup)
    changed = install.apply_install(plan)
    assert any("copied" in c for c in changed) and any("wrote" in c for c in changed)
    conf = json.loads((conf_dir / "10-ferry.conflist").read_text())
    assert [p["type"] for p in conf["plugins"]] == ["ferry", "portmap"] and conf["cniVersion"] == "1.1.0"
    # stale Ferry confs gone, the other network untouched
    assert sorted(os.listdir(conf_dir)) == ["05-other.conflist", "10-ferry.conflist"]
    # relative links into the digest-named copy; they run
    for name in ("ferry", "ferry-ipam"):
        link = bin_dir / name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert os.readlink(link).startswith(".ferry-bundle/")
    p = subprocess.run([str(bin_dir / "ferry")], env={"CNI_COMMAND": "VERSION"}, input=b"", check=False,
                       capture_output=True, timeout=30)
    assert p.returncode == 0 and b"1.1.0" in p.stdout

    snapshot = {f: os.lstat(os.path.join(dp, f)).st_mtime_ns for dp, _, fs in os.walk(tmp_path) for f in fs}
    again = install.apply_install(install.plan_install(str(fake_bundle), str(bin_dir), str(conf_dir), "1.1.0",
                                                       versions_of=sup))
    assert again == []
    assert snapshot == {f: os.lstat(os.path.join(dp, f)).st_mtime_ns for dp, _, fs in os.walk(tmp_path) for f in fs}

    # a new bundle: copied beside, links switched, the old copy kept (a call that exec'd the old
    # link a moment ago still reads it); the next one removes the oldest: never more than two
    (v1,) = os.listdir(bin_dir / ".ferry-bundle")
    (fake_bundle / "_internal" / "lib.so").write_bytes(b"\x7fELF v2")
    install.apply_install(install.plan_install(str(fake_bundle), str(bin_dir), str(conf_dir), "1.0.0",
                                               versions_of=sup))
    (v2,) = set(os.listdir(bin_dir / ".ferry-bundle")) - {v1}
    assert os.readlink(bin_dir / "ferry") == f".ferry-bundle/{v2}/ferry"
    assert os.readlink(bin_dir / "ferry-ipam") == f".ferry-bundle/{v2}/ferry-ipam"
    assert json.loads((conf_dir / "10-ferry.conflist").read_text())["cniVersion"] == "1.0.0"
    same = install.plan_install(str(fake_bundle), str(bin_dir), str(conf_dir), "1.0.0", versions_of=sup)
    assert install.apply_install(same) == []  # the same bundle again: nothing written, v1 stays
    assert sorted(os.listdir(bin_dir / ".ferry-bundle")) == sorted([v1, v2])
    (fake_bundle / "_internal" / "lib.so").write_bytes(b"\x7fELF v3")
    install.apply_install(install.plan_install(str(fake_bundle), str(bin_dir), str(conf_dir), "1.0.0",
                                               versions_of=sup))
    (v3,) = set(os.listdir(bin_dir / ".ferry-bundle")) - {v1, v2}
    assert sorted(os.listdir(bin_dir / ".ferry-bundle")) == sorted([v2, v3])
    assert os.readlink(bin_dir / "ferry") == f".ferry-bundle/{v3}/ferry"
    # back to v2 (a rollback): no copy, the links switched, v3 kept as the one before
    (fake_bundle / "_internal" / "lib.so").write_bytes(b"\x7fELF v2")
    back = install.apply_install(install.plan_install(str(fake_bundle), str(bin_dir), str(conf_dir), "1.0.0",
                                                      versions_of=sup))
    assert not any(c.startswith("copied") for c in back) and any(c.startswith("linked") for c in back)
    assert sorted(os.listdir(bin_dir / ".ferry-bundle")) == sorted([v2, v3])
    assert os.readlink(bin_dir / "ferry") == f".ferry-bundle/{v2}/ferry"

    lines: list[str] = []
    install.install_cni(str(bin_dir), str(conf_dir), do_uninstall=True, log=lines.append)
    assert sorted(os.listdir(conf_dir)) == ["05-other.conflist"]
    assert set(os.listdir(bin_dir)) == before_bin
    lines.clear()
    install.install_cni(str(bin_dir), str(conf_dir), do_uninstall=True, log=lines.append)
    assert lines == ["nothing of ferry installed"]


def test_stale_copies_keep_the_new_and_the_linked_ones() -> None:
    a, b, c = "a" * 16, "b" * 16, "c" * 16
    # switching from b to c: a goes, b (a call may still read it) stays, a dead temp dir goes
    assert install.stale_copies([a, b, c, f"{c}.tmp7"], c, {b}) == [a, f"{c}.tmp7"]
    # not switching: no copy goes
    assert install.stale_copies([a, b, c], c, {c}) == []
    # links split between two copies (an install died between the two renames): both kept
    assert install.stale_copies([a, b, c], c, {a, b}) == []
    # no links yet (a first install, or links that are not ours): every other copy goes
    assert install.stale_copies([a, c], c, set()) == [a]


def test_linked_copies_reads_only_our_links(tmp_path: Path) -> None:
    (tmp_path / "ferry").symlink_to(".ferry-bundle/0123456789abcdef/ferry")
    (tmp_path / "ferry-ipam").symlink_to("/usr/lib/cni/host-local")
    assert install.linked_copies(str(tmp_path)) == {"0123456789abcdef"}


def test_cli_refuses_without_a_bundle_when_not_frozen(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-c", "from routesync.cli import main; main()", "install-cni",
                        "--cni-bin-dir", str(tmp_path / "b"), "--cni-conf-dir", str(tmp_path / "c")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode != 0 and "--bundle-dir" in p.stderr
    assert not (tmp_path / "c" / "10-ferry.conflist").exists()


def test_cli_writes_overrides_and_version(fake_bundle: Path, tmp_path: Path) -> None:
    over = tmp_path / "over.json"
    over.write_text(json.dumps({"bridge": "br-x", "ipam": {"dataDir": "/d"}}))
    p = subprocess.run([sys.executable, "-c", "from routesync.cli import main; main()", "install-cni",
                        "--bundle-dir", str(fake_bundle), "--cni-bin-dir", str(tmp_path / "b"),
                        "--cni-conf-dir", str(tmp_path / "c"), "--cni-version", "0.4.0",
                        "--ferry-conf", str(over)], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    conf = json.loads((tmp_path / "c" / "10-ferry.conflist").read_text())
    assert conf["cniVersion"] == "0.4.0"
    assert conf["plugins"] == [{"type": "ferry", "stateFile": "/var/run/ferry/node-state.json",
                                "logFile": "/var/log/ferry/cni.log", "bridge": "br-x",
                                "ipam": {"type": "ferry-ipam", "dataDir": "/d"}}]


# --- cniVersion: auto (the default) and the runtime that reads the conflist ---------------------

def cli(fake_bundle: Path, conf_dir: Path, *args: str, env: dict[str, str] | None = None,
        path: str = "/nonexistent") -> subprocess.CompletedProcess[str]:
    """install-cni as a user runs it; PATH without containerd/crio/podman unless ``path`` says so."""
    return subprocess.run([sys.executable, "-c", "from routesync.cli import main; main()", "install-cni",
                           "--bundle-dir", str(fake_bundle), "--cni-bin-dir", str(conf_dir.parent / "bin"),
                           "--cni-conf-dir", str(conf_dir), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": path, **(env or {})})


def written_version(conf_dir: Path) -> str:
    return json.loads((conf_dir / "10-ferry.conflist").read_text())["cniVersion"]


@pytest.mark.parametrize(("runtime", "expected"), [
    ("containerd://1.6.20", "1.0.0"), ("containerd://1.7.24", "1.0.0"), ("containerd://2.0.0", "1.1.0"),
    ("cri-o://1.34.0", "1.1.0"), ("podman://4.3.1", "1.0.0"), ("containerd://1.5.18", "0.4.0"),
    ("docker://24.0.7", "1.0.0"),
])
def test_cli_auto_writes_what_the_runtime_reads(fake_bundle: Path, tmp_path: Path, runtime: str,
                                                expected: str) -> None:
    conf_dir = tmp_path / "net.d"
    p = cli(fake_bundle, conf_dir, "--cni-version", "auto", "--runtime-version", runtime)
    assert p.returncode == 0, p.stderr
    assert written_version(conf_dir) == expected
    assert f"cniVersion {expected} (auto)" in p.stdout


def test_cli_default_is_auto(fake_bundle: Path, tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    p = cli(fake_bundle, conf_dir, "--runtime-version", "containerd://2.1.4")
    assert p.returncode == 0, p.stderr
    assert written_version(conf_dir) == "1.1.0"
    p = cli(fake_bundle, conf_dir, "--runtime-version", "containerd://1.6.20")
    assert p.returncode == 0, p.stderr
    assert written_version(conf_dir) == "1.0.0"  # the old default's 1.1.0 conflist is replaced


def test_cli_auto_without_any_runtime_falls_back_to_1_0_0(fake_bundle: Path, tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    p = cli(fake_bundle, conf_dir)
    assert p.returncode == 0, p.stderr
    assert written_version(conf_dir) == "1.0.0"
    assert "assuming it reads results up to 1.0.0" in p.stdout


def test_cli_auto_asks_the_runtimes_on_the_host(fake_bundle: Path, tmp_path: Path) -> None:
    host_bin = tmp_path / "host-bin"
    host_bin.mkdir()
    (host_bin / "containerd").write_text(
        "#!/bin/sh\necho 'containerd github.com/containerd/containerd/v2 v2.0.0 207ad711'\n")
    (host_bin / "containerd").chmod(0o755)
    conf_dir = tmp_path / "net.d"
    p = cli(fake_bundle, conf_dir, path=f"{host_bin}:/usr/bin:/bin")
    assert p.returncode == 0, p.stderr
    reading_podman = os.access("/usr/bin/podman", os.X_OK)  # Debian's podman 4.3.1 reads the conf dir too
    assert written_version(conf_dir) == ("1.0.0" if reading_podman else "1.1.0")
    assert f"`{host_bin / 'containerd'} --version`" in p.stdout


def test_cli_refuses_1_1_0_for_containerd_1_6_and_writes_nothing(fake_bundle: Path, tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    p = cli(fake_bundle, conf_dir, "--cni-version", "1.1.0", "--runtime-version", "containerd://1.6.20")
    assert p.returncode != 0
    assert "--cni-version 1.1.0" in p.stderr and "--force" in p.stderr and "up to 1.0.0" in p.stderr
    assert not (conf_dir / "10-ferry.conflist").exists() and not (tmp_path / "bin" / "ferry").exists()
    # an existing conflist stays as it was
    assert cli(fake_bundle, conf_dir, "--runtime-version", "containerd://1.6.20").returncode == 0
    before = (conf_dir / "10-ferry.conflist").read_text()
    p = cli(fake_bundle, conf_dir, "--cni-version", "1.1.0", "--runtime-version", "containerd://1.6.20")
    assert p.returncode != 0 and (conf_dir / "10-ferry.conflist").read_text() == before
    # --force writes it, and says what it overrides
    p = cli(fake_bundle, conf_dir, "--cni-version", "1.1.0", "--runtime-version", "containerd://1.6.20", "--force")
    assert p.returncode == 0, p.stderr
    assert written_version(conf_dir) == "1.1.0" and "--force" in p.stdout


def test_cli_refuses_a_bad_runtime_version(fake_bundle: Path, tmp_path: Path) -> None:
    p = cli(fake_bundle, tmp_path / "net.d", "--runtime-version", "containerd 1.7.24")
    assert p.returncode != 0 and "--runtime-version" in p.stderr
    assert not (tmp_path / "net.d" / "10-ferry.conflist").exists()


@pytest.mark.parametrize(("runtime", "expected"), [("containerd://1.7.24", "1.0.0"), ("containerd://2.1.4", "1.1.0")])
def test_cli_auto_reads_the_node_object(fake_bundle: Path, tmp_path: Path, runtime: str, expected: str) -> None:
    """NODE_NAME (as the DaemonSet sets it) and the Node's status.nodeInfo.containerRuntimeVersion,
    through the Kubernetes client against a server speaking the API's wire format."""
    from tests.support.kubeserver import KubeServer, make_node

    node = make_node("node-7", "192.168.77.17", ["10.244.7.0/24"])
    node["status"]["nodeInfo"]["containerRuntimeVersion"] = runtime
    with KubeServer() as server:
        server.state.put(node)
        kubeconfig = server.kubeconfig(str(tmp_path / "kubeconfig"))
        conf_dir = tmp_path / "net.d"
        p = cli(fake_bundle, conf_dir, "--kubeconfig", kubeconfig, env={"NODE_NAME": "node-7"})
        assert p.returncode == 0, p.stderr
        assert written_version(conf_dir) == expected
        assert "Node node-7 status.nodeInfo.containerRuntimeVersion" in p.stdout
        assert any(path == "/api/v1/nodes/node-7" for _, method, path in server.state.requests if method == "GET")
        # a Node the server does not have: said, then the host (none here), then 1.0.0
        p = cli(fake_bundle, conf_dir, "--kubeconfig", kubeconfig, "--node-name", "node-8")
        assert p.returncode == 0, p.stderr
        assert "cannot read Node node-8" in p.stdout and written_version(conf_dir) == "1.0.0"


def test_auto_keeps_portmap_chained_on_a_runtime_that_reads_1_1_0(fake_bundle: Path, tmp_path: Path) -> None:
    """containerd 2 reads 1.1.0, but the host's portmap speaks up to 1.0.0 (Debian's 1.1.1 plugins):
    auto writes 1.0.0 with portmap rather than 1.1.0 without hostPorts; an explicit 1.1.0 leaves it out."""
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    bin_dir.mkdir()
    executable(bin_dir / "portmap")
    sup = versions({"portmap": ("0.3.1", "0.4.0", "1.0.0")})
    lines: list[str] = []
    install.install_cni(str(bin_dir), str(conf_dir), str(fake_bundle), "auto", log=lines.append,
                        runtime_version="containerd://2.0.0", versions_of=sup, local=list)
    conf = json.loads((conf_dir / "10-ferry.conflist").read_text())
    assert conf["cniVersion"] == "1.0.0" and [p["type"] for p in conf["plugins"]] == ["ferry", "portmap"]
    assert any("that portmap also supports" in line for line in lines), lines
    install.install_cni(str(bin_dir), str(conf_dir), str(fake_bundle), "1.1.0", log=lines.append,
                        runtime_version="containerd://2.0.0", versions_of=sup, local=list)
    conf = json.loads((conf_dir / "10-ferry.conflist").read_text())
    assert conf["cniVersion"] == "1.1.0" and [p["type"] for p in conf["plugins"]] == ["ferry"]


# --- networkPolicyOnly: chained after the primary CNI ------------------------------------------

PTP = {"cniVersion": "1.0.0", "name": "ptp", "plugins": [
    {"type": "ptp", "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": True}}]}


def test_chained_after_the_primary_conf(fake_bundle: Path, tmp_path: Path) -> None:
    """install-cni --config (networkPolicyOnly) writes 00-ferry-chained.conflist: the first
    non-Ferry conf's plugins, its name and cniVersion, then ferry without IPAM; an earlier
    10-ferry.conflist goes, the primary stays; with no primary it fails and writes nothing."""
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    conf_dir.mkdir()
    cfg = tmp_path / "route-sync.yaml"
    cfg.write_text("nodeName: n1\ntrafficEncapMode: networkPolicyOnly\n")
    p = cli(fake_bundle, conf_dir, "--config", str(cfg))
    assert p.returncode != 0 and "no primary CNI conf" in p.stderr and os.listdir(conf_dir) == []
    (conf_dir / "10-ferry.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "ferry",
                                                            "plugins": [{"type": "ferry"}]}))
    (conf_dir / "20-ptp.conflist").write_text(json.dumps(PTP))
    (conf_dir / "30-other.conf").write_text(json.dumps({"cniVersion": "0.4.0", "name": "x", "type": "bridge"}))
    p = cli(fake_bundle, conf_dir, "--config", str(cfg))
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(conf_dir)) == ["00-ferry-chained.conflist", "20-ptp.conflist", "30-other.conf"]
    doc = json.loads((conf_dir / "00-ferry-chained.conflist").read_text())
    assert (doc["cniVersion"], doc["name"]) == ("1.0.0", "ptp")
    assert doc["plugins"][:2] == PTP["plugins"]
    assert doc["plugins"][2] == {"type": "ferry", "stateFile": "/var/run/ferry/node-state.json",
                                 "logFile": "/var/log/ferry/cni.log"}
    # the same mode from an encap config: back to 10-ferry.conflist, the chained one removed
    cfg.write_text("nodeName: n1\ntrafficEncapMode: encap\n")
    p = cli(fake_bundle, conf_dir, "--config", str(cfg), "--cni-version", "1.0.0")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(conf_dir)) == ["10-ferry.conflist", "20-ptp.conflist", "30-other.conf"]
    # uninstall removes only Ferry's
    install.install_cni(str(bin_dir), str(conf_dir), do_uninstall=True, log=lambda _s: None)
    assert sorted(os.listdir(conf_dir)) == ["20-ptp.conflist", "30-other.conf"]


def test_chained_single_conf_and_bad_inputs(tmp_path: Path) -> None:
    t = install.load_templates()
    single = ("/d/10-bridge.conf", {"cniVersion": "0.3.1", "name": "br", "type": "bridge", "bridge": "cni0"})
    doc = install.render_chained(t, single, {"bridge": "br-x"}, ["portmap", "bandwidth"])
    assert doc["cniVersion"] == "0.3.1" and doc["name"] == "br"
    assert [p["type"] for p in doc["plugins"]] == ["bridge", "ferry", "portmap", "bandwidth"]
    assert [p["type"] for p in install.render_chained(t, ("/d/p.conflist", PTP), None, ["portmap"])["plugins"]] == [
        "ptp", "portmap", "ferry"]  # the primary's own portmap, not a second one
    assert doc["plugins"][0] == {
        "type": "bridge", "bridge": "cni0"}
    assert doc["plugins"][1]["bridge"] == "br-x" and "ipam" not in doc["plugins"][1]
    with pytest.raises(install.InstallError, match="cniVersion '0.2.0'"):
        install.render_chained(t, ("/d/x.conf", {**single[1], "cniVersion": "0.2.0"}))
    with pytest.raises(install.InstallError, match="plugins must be"):
        install.render_chained(t, ("/d/x.conflist", {"cniVersion": "1.0.0", "plugins": [{"bridge": "x"}]}))
    bad = tmp_path / "rs.yaml"
    bad.write_text("trafficEncapMode: overlay\n")
    with pytest.raises(install.InstallError, match="trafficEncapMode"):
        install.chained_mode(str(bad))
    assert install.chained_mode(None) is False
