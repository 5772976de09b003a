"""NetworkPolicy checks shared by the Kubernetes suites: the policy objects, and the window check
that every mode's cluster runs (tests/e2e/kube/test_kube_modes.py, and the policy walk in
tests/e2e/kube/test_kube_policy.py).

The window check (issue 27: a Pod a policy selects is never reachable, not for one packet, before
its policy is in force): a default-deny-ingress policy for Pods labelled ``window=yes`` exists, and
the Node's state file lists its namespace (route-sync wrote it, so the plugin's ADD there installs
the Pod's pending drops with its port flows); then such a Pod is created through the API, and from
the moment the API shows its addresses, probes from a Pod on another Node to a closed port of each
address must time out: a Pod that a packet reaches answers with a reset.  Deleting the policy
opens it (the reset comes back), which shows the probe could have seen one."""

from __future__ import annotations

import json
import time
from typing import Any, Self

from lab import layout
from lab.api import Lab, Pod
from lab.kube import pods as kube_pods
from lab.kube import services as svc

NS = svc.NAMESPACE
CLOSED_PORT = 81  # nothing listens there in the lab's Pods: a reset, when a packet gets through
PROBES = 5  # per address, 0.5 s each


def policy(name: str, selector: dict, ingress: list | None = None, egress: list | None = None) -> dict:
    types = (["Ingress"] if ingress is not None else []) + (["Egress"] if egress is not None else [])
    spec: dict = {"podSelector": {"matchLabels": selector}, "policyTypes": types}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


class Policies:
    def __init__(self, lab: Lab) -> None:
        self.cluster = lab.kube()

    def apply(self, doc: dict) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def delete(self, name: str) -> None:
        self.cluster.kubectl("delete", "networkpolicy", "-n", NS, name, "--wait=true")


def policy_namespaces(lab: Lab, node: str) -> list[str]:
    """The namespaces with policies in ``node``'s state file (route-sync writes it through the
    DaemonSet's mount of the Node's run directory)."""
    try:
        with open(layout.node_paths(lab.dir, node).state_file, encoding="utf-8") as f:
            return list(json.load(f).get("policyNamespaces") or [])
    except (OSError, ValueError):
        return []


def _addresses(lab: Lab, name: str) -> list[str]:
    out = lab.kube().kubectl("get", "pod", "-n", NS, name, "-o", "jsonpath={.status.podIPs[*].ip}", check=False)
    return out.stdout.split()


def _reset(answer: str) -> bool:
    return "Refused" in answer or "reset" in answer.lower()


def check_window(lab: Lab, prober: Pod, node: str, name: str = "window-pod") -> dict[str, Any]:
    """The window check (module docstring) for a Pod on ``node``, probed from ``prober`` (a lab
    Pod on another Node); raises AssertionError naming what went wrong.  Returns what it saw:
    the addresses, the probes sent and the seconds until the Pod opened after the delete."""
    pol = Policies(lab)
    pol.apply(policy("window", {"window": "yes"}, ingress=[]))
    doc = kube_pods.pod_spec(name, node)
    doc["metadata"]["labels"]["window"] = "yes"
    deadline = time.monotonic() + 30
    while NS not in policy_namespaces(lab, node):
        assert time.monotonic() < deadline, f"{node}'s state file never listed the namespace {NS}"
        time.sleep(0.2)
    cluster = lab.kube()
    cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
    try:
        ips: list[str] = []
        deadline = time.monotonic() + 120
        while not ips:
            assert time.monotonic() < deadline, f"{name} never got an address"
            ips = _addresses(lab, name)
        answers = [(ip, lab.connect(prober, ip, CLOSED_PORT, timeout=0.5).detail) for _ in range(PROBES) for ip in ips]
        reached = [a for a in answers if _reset(a[1])]
        assert not reached, f"{len(reached)} of {len(answers)} probes reached the isolated Pod: {answers}"
        pol.delete("window")
        t0 = time.monotonic()
        for ip in ips:
            while not _reset(lab.connect(prober, ip, CLOSED_PORT, timeout=0.5).detail):
                assert time.monotonic() < t0 + 20, f"{name} ({ip}) never opened after its policy went"
        return {"addresses": ips, "probes": len(answers), "opened_s": time.monotonic() - t0}
    finally:
        cluster.kubectl("delete", "pod", "-n", NS, name, "--wait=false", check=False)
        cluster.kubectl("delete", "networkpolicy", "-n", NS, "window", "--ignore-not-found", check=False)


class ConnectProbe:
    """Connections from ``src`` to ``addr`` in a loop on a thread, until stopped: how many were
    tried, how many got through, and the longest stretch in which none did (from the first failed
    attempt's start to the next success's start: how long an allowed peer was blocked)."""

    def __init__(self, lab: Lab, src: Pod, addr: str, port: int, timeout: float = 0.5) -> None:
        import threading

        self.lab, self.src, self.addr, self.port, self.timeout = lab, src, addr, port, timeout
        self.tried = self.through = 0
        self.longest_blocked = 0.0
        self._blocked_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            ok = self.lab.connect(self.src, self.addr, self.port, timeout=self.timeout).ok
            self.tried += 1
            self.through += ok
            if not ok and self._blocked_since is None:
                self._blocked_since = t
            elif ok and self._blocked_since is not None:
                self.longest_blocked = max(self.longest_blocked, t - self._blocked_since)
                self._blocked_since = None

    @property
    def failed(self) -> int:
        return self.tried - self.through

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._blocked_since is not None:  # blocked to the end: as long as it lasted
            self.longest_blocked = max(self.longest_blocked, time.monotonic() - self._blocked_since)


def settles(lab: Lab, src: Pod, addr: str, want: bool, port: int, timeout: float = 20.0) -> bool:
    """Whether probes from ``src`` settle on ``want`` (a policy is realized on its own schedule:
    the deadline only bounds a hang); then three more in a row agree."""
    deadline = time.monotonic() + timeout
    while lab.connect(src, addr, port, timeout=2.0).ok != want:
        if time.monotonic() > deadline:
            return False
    return all(lab.connect(src, addr, port, timeout=2.0).ok == want for _ in range(3))
