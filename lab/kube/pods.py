"""Workload Pods on the lab's Kubernetes cluster, created through the API as users create them.

A Pod is created from a Pod spec (the lab's busybox image, pinned to a Node with a nodeSelector so
the real scheduler binds it), waited for until it runs with ``status.podIPs``, then found in the
Node's OVS by the Pod name and namespace that CNI_ARGS carried into the port's ``external_ids``.
Its network namespace (containerd's ``/var/run/netns/cni-...``, in the Node's mount namespace) is
attached on this machine as ``<lab>-<node>-<pod>`` (``ip netns attach``), so that the lab's probes
(ping, TCP echo) and tests reach it like any other lab Pod."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cni.pipeline.tables import EXT_IPS, EXT_MAC, EXT_NETNS, EXT_POD_NAME, EXT_POD_NAMESPACE
from lab.kube.plan import WORKLOAD_IMAGE
from lab.sh import LabError, run

NAMESPACE = "default"


def api_name(node: str, pod: str) -> str:
    """The Pod's name in the API: Pod names are unique per namespace, the lab's per Node."""
    return f"{node}-{pod}"


def pod_spec(name: str, node: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "ferry-lab"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sleep", "2147483647"]}]}}


@dataclass(frozen=True)
class Attachment:
    """What Ferry's plugin recorded on the Pod's OVS port."""

    port: str
    netns: str  # the path as the Node sees it
    ips: tuple[str, ...]  # CIDR notation
    mac: str | None


def find_attachment(ovs_exec: Callable[[list[str]], subprocess.CompletedProcess[str]], name: str,
                    namespace: str) -> Attachment | None:
    cp = ovs_exec(["ovs-vsctl", "--format=json", "--columns=name,external_ids,ofport", "find", "Interface",
                   f"external_ids:{EXT_POD_NAME}={name}", f"external_ids:{EXT_POD_NAMESPACE}={namespace}"])
    if cp.returncode != 0:
        return None
    rows = json.loads(cp.stdout).get("data") or []
    if not rows:
        return None
    # a port whose device is open first: a dead sandbox's row (a reboot's, until its DEL) has none
    rows.sort(key=lambda row: not (isinstance(row[2], int) and row[2] > 0))
    port, ids = rows[0][0], dict(rows[0][1][1])
    ips = tuple(a for a in ids.get(EXT_IPS, "").split(",") if a)
    return Attachment(port, ids.get(EXT_NETNS, ""), ips, ids.get(EXT_MAC))


def netns_inode(mount_ns: str, path: str) -> int:
    cp = subprocess.run(["nsenter", f"--mount={mount_ns}", "--", "stat", "-L", "-c", "%i", path],
                        capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise LabError(f"cannot stat the Pod's netns {path}: {cp.stderr.strip()}")
    return int(cp.stdout)


def pid_in_netns(inode: int) -> int | None:
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                if os.stat(f"/proc/{e}/ns/net").st_ino == inode:
                    return int(e)
            except OSError:
                continue
    return None


def attach_netns(mount_ns: str, pod_netns_path: str, name: str) -> None:
    """``/run/netns/<name>`` on this machine for the Pod's network namespace."""
    inode = netns_inode(mount_ns, pod_netns_path)
    pid = pid_in_netns(inode)
    if pid is None:
        raise LabError(f"no process in the Pod's netns {pod_netns_path}")
    run(["ip", "netns", "attach", name, str(pid)])


def result_of(att: Attachment) -> dict[str, Any]:
    """A CNI-result-shaped record of the Pod's attachment (what the lab keeps per Pod)."""
    return {"interfaces": [{"name": att.port}, {"name": "eth0", "mac": att.mac, "sandbox": att.netns}],
            "ips": [{"interface": 1, "address": a} for a in att.ips]}


def wait_running(get: Callable[[], dict[str, Any] | None], timeout: float) -> dict[str, Any]:
    """The Pod object once it runs with IPs; bounded by ``timeout`` (a hang), polled on the API."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        last = get()
        st = (last or {}).get("status") or {}
        if st.get("phase") == "Running" and st.get("podIPs"):
            return last or {}
        if st.get("phase") in ("Failed", "Succeeded"):
            break
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    st = (last or {}).get("status") or {}
    raise LabError(f"Pod did not run with an IP within {timeout:.0f}s: phase {st.get('phase')}, "
                   f"conditions {json.dumps(st.get('conditions'))}, "
                   f"containers {json.dumps(st.get('containerStatuses'))}")
