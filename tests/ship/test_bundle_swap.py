"""install-cni replacing the frozen bundle while the runtime keeps calling the plugin (issue 42).

A Node-like namespace with its own Open vSwitch (netdev), the real frozen bundle in two versions
(the same build, a marker file in ``_internal`` differing), and 8 callers each looping ADD then
DEL by exec'ing ``<bin>/ferry`` with the CNI environment as a runtime does, while install-cni
replaces the bundle 20 times, alternating between the two.  Every call must succeed with a result
valid per the CNI spec; the entry points must always resolve to one whole bundle (its files as
the source's); nothing (veth, OVS port, per-Pod flow, IP) may be left at the end.

Synchronised on events only: each replacement waits until every caller has finished a call since
the previous replacement returned (so each one lands among running calls), and the watcher checks
the links after every call and every replacement.  Names start with "sp8" (tests/ship)."""

from __future__ import annotations

import collections
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cni.pipeline import tables as pl
from cni.spec.errors import CniError
from cni.spec.result import decode
from routesync import install
from tests.ship.helpers import run
from tests.support.ovs_instance import OvsInstance, netns

pytestmark = [pytest.mark.root, pytest.mark.slow]

CALLERS = 8
SWAPS = 20
CNI_VERSION = "1.0.0"
MARKER = "ferry-test-marker"
MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
STALL = 300.0  # a deadlock guard only: every wait below ends on an event long before


def kind(failure: str) -> str:
    """A failure without its Pod, pids, times and paths: what to count it by."""
    text = failure.split(": ", 1)[-1]
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z pid=\d+ |PYI-\d+|sp8[\w-]+|/tmp/\S+", "", text)
    return re.sub(r"\s+", " ", text)[:160]


def manifest(bundle: str) -> dict[str, str]:
    """Every file of a bundle by relative path: its size (a symlink: its target)."""
    out = {}
    for dirpath, _dirs, files in os.walk(bundle):
        for fn in files:
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, bundle)
            out[rel] = f"-> {os.readlink(path)}" if os.path.islink(path) else str(os.lstat(path).st_size)
    return out


def marked_copy(bundle: Path, dest: Path, marker: str) -> Path:
    shutil.copytree(bundle, dest, symlinks=True)
    (dest / "_internal" / MARKER).write_text(marker + "\n")
    return dest


def result_problems(stdout: bytes, sandbox: str) -> list[str]:
    """What is wrong with an ADD's stdout as a CNI 1.0.0 result for a Pod in ``sandbox``."""
    try:
        text = stdout.decode("utf-8")
        doc = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        return [f"not JSON: {e}: {stdout[:300]!r}"]
    if not isinstance(doc, dict):
        return [f"not an object: {text[:300]}"]
    problems = []
    if doc.get("cniVersion") != CNI_VERSION:
        problems.append(f"cniVersion {doc.get('cniVersion')!r}")
    try:
        res = decode(doc, "result")
    except CniError as e:
        return [*problems, f"invalid result: {e}"]
    pod_ifs = [n for n, i in enumerate(res.interfaces) if i.sandbox == sandbox and i.name == "eth0"]
    if len(pod_ifs) != 1:
        problems.append(f"no single eth0 in {sandbox}: {doc.get('interfaces')}")
    if any(i.mac and not MAC.match(i.mac) for i in res.interfaces):
        problems.append(f"bad MAC: {doc.get('interfaces')}")
    if not res.ips or any(ip.interface not in pod_ifs for ip in res.ips):
        problems.append(f"ips not on the Pod's interface: {doc.get('ips')}")
    return problems


@dataclass
class Load:
    """What the callers, the watcher and the installer share (under ``cond``)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    done: list[int] = field(default_factory=lambda: [0] * CALLERS)  # ADD+DEL pairs per caller
    calls: int = 0  # plugin execs finished
    failures: list[str] = field(default_factory=list)
    half_seen: list[str] = field(default_factory=list)
    stop: bool = False
    events: int = 0  # bumped on every finished call and every replacement: the watcher's clock

    def wait_round(self) -> bool:
        """Until every caller has finished one more ADD+DEL than now (False: the guard ran out)."""
        with self.cond:
            mark = list(self.done)
            return self.cond.wait_for(lambda: self.stop or all(d > x for d, x in zip(self.done, mark, strict=True)),
                                      timeout=STALL) and not self.stop

    def bump(self) -> None:
        with self.cond:
            self.events += 1
            self.cond.notify_all()


@dataclass
class Setup:
    node_ns: str
    bin_dir: Path
    conf_dir: Path
    ipam_dir: Path
    overrides: Path
    bundles: tuple[Path, Path]
    manifests: dict[str, dict[str, str]]  # marker -> manifest


@pytest.fixture
def setup(bundle: Path, tmp_path: Path) -> Iterator[Setup]:
    a = marked_copy(bundle, tmp_path / "bundle-a", "a")
    b = marked_copy(bundle, tmp_path / "bundle-b", "b")
    name = f"sp8-{secrets.token_hex(3)}"
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        overrides = tmp_path / "ferry-conf.json"
        overrides.write_text(json.dumps({
            "stateFile": str(tmp_path / "state" / "node-state.json"), "bridge": "br-int", "ovsdb": ovs.db,
            "ovsRunDir": ovs.run_dir, "datapath": "netdev", "logFile": str(tmp_path / "cni.log"),
            "ipam": {"dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": "10.244.1.0/24"}]]}}))
        s = Setup(ns, tmp_path / "bin", tmp_path / "net.d", tmp_path / "ipam", overrides, (a, b),
                  {"a": manifest(str(a)), "b": manifest(str(b))})
        s.bin_dir.mkdir()
        pods = [f"{ns}-c{i}" for i in range(CALLERS)]
        for p in pods:
            run(["ip", "netns", "add", p])
        try:
            yield s
            # nothing of any Pod left on the Node
            links = [ln.split(":")[1].strip().split("@")[0]
                     for ln in run(["ip", "-n", ns, "-o", "link", "show"]).stdout.splitlines()]
            assert [n for n in links if n.startswith(pl.HOST_VETH_PREFIX)] == [], f"host veths left: {links}"
            ports = ovs.vsctl("list-ports", "br-int").split()
            assert [p for p in ports if p.startswith(pl.HOST_VETH_PREFIX)] == [], f"OVS ports left: {ports}"
            flows = ovs.ofctl("dump-flows", "br-int", f"cookie={pl.Cookie.owner_match(pl.Owner.POD)}")
            assert [f for f in flows.splitlines() if "cookie=" in f] == [], f"per-Pod flows left:\n{flows}"
            allocs = run([str(s.bin_dir / "ferry-ipam"), "ls", "--json", "--data-dir", str(s.ipam_dir)]).stdout
            assert "10.244." not in allocs, f"IPAM records left: {allocs}"
        finally:
            for p in pods:
                run(["ip", "netns", "del", p], check=False)


def install_cni(s: Setup, src: Path) -> list[str]:
    lines: list[str] = []
    install.install_cni(str(s.bin_dir), str(s.conf_dir), str(src), CNI_VERSION, str(s.overrides),
                        log=lines.append, local=list)
    return lines


def plugin_conf(s: Setup) -> bytes:
    """The ferry entry of the conflist install-cni wrote, as the runtime passes it."""
    doc = json.loads((s.conf_dir / install.CONFLIST_NAME).read_text())
    return json.dumps({**doc["plugins"][0], "cniVersion": doc["cniVersion"], "name": doc["name"]}).encode()


def call(s: Setup, command: str, cid: str, pod_ns: str, conf: bytes) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "CNI_COMMAND": command,
           "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{pod_ns}", "CNI_IFNAME": "eth0",
           "CNI_PATH": str(s.bin_dir), "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid}"}
    return subprocess.run(["ip", "netns", "exec", s.node_ns, str(s.bin_dir / "ferry")], input=conf,
                          capture_output=True, env=env, timeout=120, check=False)


def caller(s: Setup, load: Load, i: int, conf: bytes) -> None:
    try:
        loop(s, load, i, conf)
    except BaseException as e:  # a caller gone: say so and stop the run (never wait on it)
        with load.cond:
            load.failures.append(f"caller {i}: {type(e).__name__}: {e}")
            load.stop = True
            load.cond.notify_all()
        raise


def loop(s: Setup, load: Load, i: int, conf: bytes) -> None:
    pod_ns = f"{s.node_ns}-c{i}"
    n = 0
    while True:
        with load.cond:
            if load.stop:
                return
        cid = f"sp8swap{i}x{n}"
        n += 1
        add = call(s, "ADD", cid, pod_ns, conf)
        problems = [f"rc {add.returncode}"] if add.returncode != 0 else []
        problems += result_problems(add.stdout, f"/run/netns/{pod_ns}") if add.returncode == 0 else []
        dl = call(s, "DEL", cid, pod_ns, conf)  # after a failed ADD too, as a runtime does
        with load.cond:
            load.calls += 2
            if problems:
                load.failures.append(f"ADD {cid}: {problems}; stderr: {add.stderr.decode(errors='replace')[-800:]}")
            if dl.returncode != 0 or dl.stdout.strip():
                load.failures.append(f"DEL {cid}: rc {dl.returncode} stdout {dl.stdout[:200]!r}; stderr: "
                                     f"{dl.stderr.decode(errors='replace')[-800:]}")
            load.done[i] += 1
            load.events += 1
            load.cond.notify_all()


def watcher(s: Setup, load: Load) -> None:
    """After every event: each entry point resolves into one whole bundle of the two (ferry and
    ferry-ipam may be a version apart for a moment: a running ferry execs ferry-ipam by path anyway)."""
    seen = -1
    while True:
        with load.cond:
            load.cond.wait_for(lambda last=seen: load.stop or load.events != last, timeout=STALL)
            if load.stop:
                return
            seen = load.events
        dirs = {os.path.dirname(os.path.realpath(s.bin_dir / n)) for n in install.LINKED}
        for d in dirs:
            try:
                marker = Path(d, "_internal", MARKER).read_text().strip()
            except OSError as e:
                marker = f"unreadable: {e}"
            got = manifest(d)
            if marker not in s.manifests or got != s.manifests[marker]:
                missing = sorted(set(s.manifests.get(marker, s.manifests["a"])) - set(got))[:5]
                with load.cond:
                    load.half_seen.append(f"{d}: marker {marker!r}, {len(got)} files, missing e.g. {missing}")


def test_bundle_replaced_under_load(setup: Setup) -> None:
    s = setup
    install_cni(s, s.bundles[0])
    conflist = (s.conf_dir / install.CONFLIST_NAME).read_text()
    conf = plugin_conf(s)
    warm = call(s, "ADD", "sp8warm", f"{s.node_ns}-c0", conf)  # the bridge made before the load
    assert warm.returncode == 0, warm.stderr.decode(errors="replace")
    assert call(s, "DEL", "sp8warm", f"{s.node_ns}-c0", conf).returncode == 0

    load = Load()
    threads = [threading.Thread(target=caller, args=(s, load, i, conf), daemon=True) for i in range(CALLERS)]
    threads.append(threading.Thread(target=watcher, args=(s, load), daemon=True))
    for t in threads:
        t.start()
    try:
        for k in range(SWAPS):
            assert load.wait_round(), f"callers stalled before replacement {k}: {load.done}"
            src = s.bundles[(k + 1) % 2]
            lines = install_cni(s, src)
            assert any("linked" in line for line in lines), lines
            load.bump()
            real = os.path.dirname(os.path.realpath(s.bin_dir / "ferry"))
            assert manifest(real) == manifest(str(src)), f"replacement {k}: {real} is not {src}"
            assert (s.conf_dir / install.CONFLIST_NAME).read_text() == conflist
        assert load.wait_round(), f"callers stalled after the last replacement: {load.done}"
    finally:
        with load.cond:
            load.stop = True
            load.cond.notify_all()
        for t in threads:
            t.join(timeout=STALL)
    print(f"\nbundle swap: {load.calls} plugin calls ({sum(load.done)} ADD+DEL pairs, per caller {load.done}) "
          f"across {SWAPS} replacements; {len(load.failures)} failed; copies on disk "
          f"{sorted(os.listdir(s.bin_dir / install.BUNDLE_DIR_NAME))}", file=sys.stderr)
    kinds = collections.Counter(f.split(" ", 1)[0] + " " + kind(f) for f in load.failures)
    assert load.failures == [], (f"{len(load.failures)} of {load.calls} calls failed, by kind:\n"
                                 + "\n".join(f"{n:5} {k}" for k, n in kinds.most_common(12))
                                 + "\nthe first:\n" + "\n".join(load.failures[:5]))
    assert load.half_seen == [], "\n".join(load.half_seen[:10])
    assert not any(t.is_alive() for t in threads)
    # on disk: the two copies (the linked one and the one before it), no temp dir
    root = s.bin_dir / install.BUNDLE_DIR_NAME
    dirs = sorted(d for d in os.listdir(root) if (root / d).is_dir())
    assert len(dirs) == 2 and all(install.is_copy_name(d) for d in dirs), dirs
    # the install stays idempotent: the same bundle again writes nothing
    again = install_cni(s, s.bundles[SWAPS % 2])
    assert not any(line.startswith(("copied", "linked", "wrote", "removed")) for line in again), again
