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

from .conftest import ROOT


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

    # a new bundle: copied beside, links switched, the old copy removed
    (fake_bundle / "_internal" / "lib.so").write_bytes(b"\x7fELF v2")
    install.apply_install(install.plan_install(str(fake_bundle), str(bin_dir), str(conf_dir), "1.0.0",
                                               versions_of=sup))
    copies = os.listdir(bin_dir / ".ferry-bundle")
    assert len(copies) == 1 and os.readlink(bin_dir / "ferry") == f".ferry-bundle/{copies[0]}/ferry"
    assert json.loads((conf_dir / "10-ferry.conflist").read_text())["cniVersion"] == "1.0.0"

    lines: list[str] = []
    install.install_cni(str(bin_dir), str(conf_dir), do_uninstall=True, log=lines.append)
    assert sorted(os.listdir(conf_dir)) == ["05-other.conflist"]
    assert set(os.listdir(bin_dir)) == before_bin
    lines.clear()
    install.install_cni(str(bin_dir), str(conf_dir), do_uninstall=True, log=lines.append)
    assert lines == ["nothing of ferry installed"]


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
