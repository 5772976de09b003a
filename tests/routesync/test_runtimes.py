"""The runtime -> libcni -> result-version table, the parsing of runtime versions, and install-cni's
choice of cniVersion from them (pure: no network, no bundle)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from routesync import install, runtimes
from routesync.install import InstallError, Runtime

SPEC_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")


def vt(v: str) -> tuple[int, int, int]:
    return runtimes.version_tuple(v)


def libcni_reads(libcni: str) -> str:
    """What pkg/types of each libcni line decodes (tools/runtime-cni-table.py reads it from source)."""
    if vt(libcni) < (1, 0, 0):
        return "0.4.0"
    return "1.0.0" if vt(libcni) < (1, 2, 0) else "1.1.0"


def reads(text: str) -> str:
    return runtimes.reading(runtimes.parse_runtime_version(text)).reads


# --- the table ---------------------------------------------------------------------------------

def test_rows_are_change_points_in_order_and_agree_with_libcni() -> None:
    for name in runtimes.RUNTIMES:
        rows = runtimes.rows_of(name)
        assert rows, name
        assert [r.since for r in rows] == [r.since for r in runtimes.ROWS if r.runtime == name]  # kept sorted
        libcnis = [vt(r.libcni) for r in rows]
        assert libcnis == sorted(libcnis) and len(set(libcnis)) == len(libcnis), name  # each row a change
        for r in rows:
            assert r.reads in SPEC_VERSIONS
            assert r.reads == libcni_reads(r.libcni), r
            module, _, at = r.source.split()[0].partition("@")
            assert at == f"v{r.since}" and module.startswith("github.com/"), r  # evidence: the go.mod of `since`


@pytest.mark.parametrize(("runtime", "expected"), [
    ("containerd://1.6.20", "1.0.0"),  # Debian 12's; libcni 1.1.1
    ("containerd://1.6.0", "1.0.0"),
    ("containerd://1.7.24", "1.0.0"),  # the issue's
    ("containerd://1.7.36", "1.0.0"),  # the last 1.7 read
    ("containerd://2.0.0", "1.1.0"),  # the first on libcni 1.2
    ("containerd://v2.1.4", "1.1.0"),
    ("containerd://2.9.0", "1.1.0"),  # newer than the table: its last row
    ("containerd://1.5.18", "0.4.0"),
    ("containerd://1.4.13", "0.4.0"),  # older than every row: no more than the oldest
    ("podman://4.3.1", "1.0.0"),  # Debian 12's
    ("podman://4.9.5", "1.0.0"),
    ("podman://5.1.2", "1.0.0"),
    ("podman://5.2.0", "1.1.0"),
    ("podman://3.4.4", "0.4.0"),
    ("cri-o://1.34.0", "1.1.0"),
    ("cri-o://1.30.4", "1.0.0"),  # between the releases the proxy served: the lower one holds
    ("docker://24.0.7", "1.0.0"),  # unknown runtime: the fallback
    ("rkt://1.30.0", "1.0.0"),
])
def test_reads(runtime: str, expected: str) -> None:
    assert reads(runtime) == expected


def test_unknown_runtime_says_so_known_one_cites_its_go_mod() -> None:
    unknown = runtimes.reading(runtimes.parse_runtime_version("docker://24.0.7"))
    assert not unknown.known and unknown.reads == runtimes.FALLBACK == "1.0.0"
    assert "not in the table" in unknown.note
    known = runtimes.reading(runtimes.parse_runtime_version("containerd://1.6.20"))
    assert known.known and known.row is not None and known.row.libcni == "1.1.1"
    assert "github.com/containerd/containerd@v1.6.5" in known.note


@pytest.mark.parametrize(("text", "runtime", "version"), [
    ("containerd://1.7.24", "containerd", (1, 7, 24)),
    ("containerd://v2.0.0", "containerd", (2, 0, 0)),
    ("containerd://1.6.20~ds1", "containerd", (1, 6, 20)),
    ("containerd://1.7.23-k3s2", "containerd", (1, 7, 23)),
    ("cri-o://1.30.4", "cri-o", (1, 30, 4)),
    ("crio://1.30", "cri-o", (1, 30, 0)),
    ("Podman://4.3.1", "podman", (4, 3, 1)),
])
def test_parse_runtime_version(text: str, runtime: str, version: tuple[int, int, int]) -> None:
    rv = runtimes.parse_runtime_version(text)
    assert (rv.runtime, rv.version) == (runtime, version)


@pytest.mark.parametrize("text", ["containerd", "1.7.24", "containerd://", "containerd://latest", "://1.2.3"])
def test_parse_runtime_version_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="containerd://1.7.24|version like"):
        runtimes.parse_runtime_version(text)


@pytest.mark.parametrize(("runtime", "output", "version"), [
    ("containerd", "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", (1, 6, 20)),
    ("containerd", "containerd containerd.io 1.7.24 88bf19b2105c8b17560993bee28a01ddc2f97182\n", (1, 7, 24)),
    ("containerd", "containerd github.com/containerd/containerd/v2 v2.0.0 207ad711eabd\n", (2, 0, 0)),
    ("cri-o", "crio version 1.20.0\n", (1, 20, 0)),
    ("cri-o", "INFO[0000] Starting CRI-O\nVersion:        1.30.4\nGitCommit:      dbe4d7e\n", (1, 30, 4)),
    ("podman", "podman version 4.3.1\n", (4, 3, 1)),
])
def test_parse_version_output(runtime: str, output: str, version: tuple[int, int, int]) -> None:
    rv = runtimes.parse_version_output(runtime, output)
    assert rv is not None and (rv.runtime, rv.version) == (runtime, version)
    assert runtimes.parse_version_output(runtime, "something else 1.2.3") is None


def test_local_runtimes_asks_the_binaries_on_path(tmp_path: Any) -> None:
    fake = tmp_path / "containerd"
    fake.write_text("#!/bin/sh\necho 'containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7'\n")
    fake.chmod(0o755)
    (tmp_path / "podman").write_text("#!/bin/sh\nexit 3\n")  # answers nothing usable: skipped
    (tmp_path / "podman").chmod(0o755)
    found = runtimes.local_runtimes(path=str(tmp_path))
    assert [(str(rv), origin) for rv, origin in found] == [("containerd://2.1.4", f"`{fake} --version`")]
    assert runtimes.local_runtimes(path=str(tmp_path / "nothing")) == []


def test_local_runtimes_on_this_host() -> None:
    if not os.access("/usr/bin/containerd", os.X_OK):
        pytest.skip("Debian's containerd not installed")
    found = {rv.runtime: rv for rv, _ in runtimes.local_runtimes(path="/usr/bin")}
    assert found["containerd"].version[:2] == (1, 6)  # Debian 12
    assert runtimes.reading(found["containerd"]).reads == "1.0.0"


# --- install-cni's choice ----------------------------------------------------------------------

def rt(text: str, origin: str = "--runtime-version") -> Runtime:
    return Runtime(runtimes.reading(runtimes.parse_runtime_version(text)), origin)


def test_auto_is_the_highest_the_runtime_reads() -> None:
    version, notes = install.resolve_cni_version("auto", [rt("containerd://2.0.0")], {})
    assert version == "1.1.0" and notes[-1] == "cniVersion 1.1.0 (auto): the highest containerd://2.0.0 reads"
    assert install.resolve_cni_version("auto", [rt("containerd://1.6.20")], {})[0] == "1.0.0"
    assert install.resolve_cni_version("auto", [rt("containerd://2.0.0")], {})[0] == "1.1.0"
    assert install.resolve_cni_version("auto", [rt("podman://4.3.1")], {})[0] == "1.0.0"
    assert install.resolve_cni_version("auto", [rt("containerd://1.5.18")], {})[0] == "0.4.0"
    # two runtimes read the conf dir: the lower one bounds it
    assert install.resolve_cni_version("auto", [rt("containerd://2.0.0"), rt("podman://4.3.1")], {})[0] == "1.0.0"


def test_auto_without_a_runtime_or_with_an_unknown_one_is_1_0_0() -> None:
    version, notes = install.resolve_cni_version("auto", [], {})
    assert version == "1.0.0" and any("assuming it reads results up to 1.0.0" in n for n in notes)
    version, notes = install.resolve_cni_version("auto", [rt("docker://24.0.7")], {})
    assert version == "1.0.0" and any("docker is not in the table" in n for n in notes)


def test_auto_keeps_chained_plugins_when_a_lower_version_does() -> None:
    present = {"portmap": ("0.3.1", "0.4.0", "1.0.0"), "bandwidth": ("0.4.0", "1.0.0", "1.1.0")}
    version, notes = install.resolve_cni_version("auto", [rt("containerd://2.0.0")], present)
    assert version == "1.0.0" and "portmap also supports" in notes[-2]
    assert notes[-1].startswith("cniVersion 1.0.0 is below 1.1.0: results carry no interface or route MTU")
    # no version every plugin supports below the ceiling: the ceiling (the plugin is left out later)
    version, _ = install.resolve_cni_version("auto", [rt("containerd://2.0.0")], {"portmap": ("0.3.1",)})
    assert version == "1.1.0"


def test_explicit_version_above_what_a_known_runtime_reads_is_refused_unless_forced() -> None:
    with pytest.raises(InstallError) as e:
        install.resolve_cni_version("1.1.0", [rt("containerd://1.6.20")], {})
    msg = str(e.value)
    assert msg.startswith("--cni-version 1.1.0:") and "--force" in msg and "--cni-version auto" in msg
    assert "containerd://1.6.20 (from --runtime-version) reads CNI results only up to 1.0.0" in msg
    version, notes = install.resolve_cni_version("1.1.0", [rt("containerd://1.6.20")], {}, force=True)
    assert version == "1.1.0" and "--force" in notes[-1]
    # at or below what it reads, or an unknown runtime: written as asked
    assert install.resolve_cni_version("0.4.0", [rt("containerd://1.6.20")], {})[0] == "0.4.0"
    assert install.resolve_cni_version("1.1.0", [rt("docker://24.0.7")], {})[0] == "1.1.0"
    assert install.resolve_cni_version("1.1.0", [], {})[0] == "1.1.0"


def test_find_runtimes_order_flag_then_node_then_host() -> None:
    def never(*_: Any) -> Any:
        raise AssertionError("not to be asked")

    host = [(runtimes.parse_runtime_version("podman://4.3.1"), "`podman --version`")]
    node = {"status": {"nodeInfo": {"containerRuntimeVersion": "containerd://2.0.2"}}}
    lines: list[str] = []
    found = install.find_runtimes("containerd://1.6.20", "n1", "/kc", lines.append, read_node=never, local=never)
    assert [(str(f.reading.runtime), f.origin) for f in found] == [("containerd://1.6.20", "--runtime-version")]

    found = install.find_runtimes(None, "n1", "/kc", lines.append, read_node=lambda kc, n: node, local=never)
    assert [(str(f.reading.runtime), f.origin) for f in found] == [
        ("containerd://2.0.2", "Node n1 status.nodeInfo.containerRuntimeVersion")]
    # in a cluster (service account), no kubeconfig needed
    found = install.find_runtimes(None, "n1", None, lines.append, read_node=lambda kc, n: node, local=never,
                                  environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert str(found[0].reading.runtime) == "containerd://2.0.2"

    def down(*_: Any) -> Any:
        raise ConnectionRefusedError("connection refused")

    lines.clear()
    found = install.find_runtimes(None, "n1", "/kc", lines.append, read_node=down, local=lambda: host)
    assert [f.origin for f in found] == ["`podman --version`"]
    assert "cannot read Node n1" in lines[0] and "ConnectionRefusedError" in lines[0]
    lines.clear()
    found = install.find_runtimes(None, "n1", "/kc", lines.append, read_node=lambda kc, n: {"status": {}},
                                  local=list)
    assert found == [] and "containerRuntimeVersion" in lines[0]
    lines.clear()
    found = install.find_runtimes(None, "n1", None, lines.append, read_node=never, local=lambda: host, environ={})
    assert [f.origin for f in found] == ["`podman --version`"] and "no Kubernetes credentials" in lines[0]
    with pytest.raises(InstallError, match="^--runtime-version: "):
        install.find_runtimes("containerd 1.7", None, None, lines.append, local=never)
