"""Files Ferry writes are root's and not writable by others; a symlink planted where Ferry writes
(IPAM store, lock files, log file) is not followed."""

from __future__ import annotations

import json
import os
import stat

import pytest

from cni.pipeline import tables as pl
from tests.support.podnode import run

pytestmark = pytest.mark.root


def _walk(root: str) -> list[str]:
    out = [root]
    for d, dirs, files in os.walk(root):
        out += [os.path.join(d, x) for x in dirs + files]
    return out


def test_files_are_roots_and_not_world_writable(fx_node):
    fx_node.add_pod("a")
    paths = _walk(str(fx_node.ipam_dir)) + _walk(str(fx_node.dir / "state")) + [str(fx_node.dir / "cni.log")]
    assert len(paths) > 5
    for p in paths:
        st = os.lstat(p)
        assert st.st_uid == 0, p
        assert not stat.S_ISLNK(st.st_mode), p
        assert not st.st_mode & stat.S_IWOTH, f"{p} is world-writable ({oct(st.st_mode)})"




@pytest.mark.parametrize("where", ["log", "lock", "ipam-claim", "ipam-record"])
def test_a_planted_symlink_is_not_followed(fx_node, where, tmp_path_factory):
    target = tmp_path_factory.mktemp("fx-target") / "victim"
    target.write_text("precious\n")
    cid = "fxsymlink1"
    a = fx_node.add_pod("warm")  # store, lock dir and log exist
    ipv4 = a.ip(4)
    nxt = ipv4.rsplit(".", 1)[0] + "." + str(int(ipv4.rsplit(".", 1)[1]) + 1)
    if where == "log":
        link = fx_node.dir / "cni.log"
        link.unlink()
    elif where == "lock":
        h = pl.sha256(f"{cid}\x00eth0".encode()).hexdigest()[:16]
        link = fx_node.dir / "state" / "locks" / f"pod-{h}.lock"
    else:
        stores = [d for d in fx_node.ipam_dir.iterdir() if d.is_dir()]
        assert stores, list(fx_node.ipam_dir.iterdir())
        link = (stores[0] / "ips" / nxt) if where == "ipam-claim" else (stores[0] / "attachments" / f"{cid}:eth0")
    os.symlink(target, link)
    ns = f"{fx_node.name}-sym"
    run(["ip", "netns", "add", ns])
    try:
        p = fx_node.direct("ADD", f"/run/netns/{ns}", cid)
        out = p.stdout.decode()
        assert "Traceback" not in out
        json.loads(out)
        assert target.read_text() == "precious\n", f"{where}: the symlink was followed"
        assert os.path.islink(link) or not os.path.exists(link)
        if p.returncode == 0:
            assert nxt not in out or where != "ipam-claim", "a claim hidden behind a symlink was handed out"
        fx_node.direct("DEL", f"/run/netns/{ns}", cid)
        assert target.read_text() == "precious\n"
    finally:
        run(["ip", "netns", "del", ns], check=False)
