"""PeerSlices on a real Kubernetes cluster (issue 46, ``docs/design/scale.md``): route-sync with
``policyPeers: peerSlices`` watches only its own Pods and the PeerSlices labelled for its Node;
ferry-controller (``deploy/ferry-controller.yaml``, two replicas, leader election by Lease) writes
the slices.

Pods: ``client`` on node-1, ``other`` on node-2, ``srv`` on node-3 with the echo server; one policy
isolates srv, allowed from Pods labelled ``role=client``.  Checks, each an observable outcome:

* what each Node receives is what its policies read: the PeerSlices the API server hands node-3's
  label selectors hold the client and not ``other``; node-1's and node-2's hold neither (no policy
  selects a Pod there).  route-sync's watches use exactly these selectors
  (``tests/routesync/policy/test_watch_peers.py``);
* enforcement from the slices: the client reaches srv, ``other`` does not; ``other`` labelled
  ``role=client`` reaches it once the controller has moved it into node-3's slices, and not after
  the label is gone;
* delivery by subscription (``ferry-controller --delivery subscription``, rolled out on the
  running cluster): every slice rewritten with its group's label alone, enforcement from the groups
  node-3 asks for by name, then back to labels;
* a failover: the Lease holder's Pod deleted while ``other`` (denied) and the client (allowed) probe
  srv without pause: not one of other's connections gets through, the client's longest blocked
  stretch is printed (the goal: at most 1 s) and no allowed connection fails; the probes run until
  the new leader (another holderIdentity) has carried a relabel into node-3's slices."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from lab.api import ECHO_PORT, Lab, Pod
from lab.kube.pods import api_name
from routesync.policy import peerslice
from tests.e2e.kube import policycheck
from tests.e2e.kube.helpers import topology
from tests.e2e.kube.policycheck import NS, ConnectProbe, Policies, policy
from tests.e2e.kube.servicecheck import pod_ip
from tests.support.waiting import until

pytestmark = [pytest.mark.root, pytest.mark.slow]

LEASE = "ferry-controller"  # deploy/ferry-controller.yaml's --lease-name


@pytest.fixture(scope="module")
def lab(kube_module_lab_of) -> Iterator[Lab]:  # type: ignore[no-untyped-def]
    yield kube_module_lab_of(topology({"trafficEncapMode": "encap", "tunnelType": "vxlan",
                                       "policyPeers": "peerSlices"}))


def received(lab: Lab, node: str, selectors: list[str] | None = None) -> set[str]:
    """The Pods (namespace/name) of the PeerSlices the API server hands ``node``'s watches: one list
    per selector (default: :func:`peerslice.node_selectors`, delivery by labels), as route-sync's
    Reflectors list them."""
    out: set[str] = set()
    for selector in peerslice.node_selectors(node) if selectors is None else selectors:
        cp = lab.kube().kubectl("get", f"{peerslice.PLURAL}.{peerslice.GROUP}", "-l", selector, "-o", "json")
        for obj in json.loads(cp.stdout)["items"]:
            out.update(p.key for p in peerslice.from_object(obj).spec.pods)
    return out


def settles(lab: Lab, src: Pod, addr: str, want: bool) -> bool:
    return policycheck.settles(lab, src, addr, want, ECHO_PORT, timeout=30.0)


def holder(lab: Lab) -> str:
    cp = lab.kube().kubectl("-n", "kube-system", "get", "lease", LEASE, "-o", "json", check=False)
    if cp.returncode != 0:
        return ""
    return str(json.loads(cp.stdout).get("spec", {}).get("holderIdentity") or "")


def test_a_node_receives_what_its_policies_read_and_enforces_it(lab: Lab) -> None:
    cluster = lab.kube()
    client, other, srv = lab.add_pod("node-1", "client"), lab.add_pod("node-2", "other"), lab.add_pod("node-3", "srv")
    lab.ensure_echo(srv.netns)
    key = {p.name: f"{NS}/{api_name(p.node, p.name)}" for p in (client, other, srv)}
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-3", "srv"), "slices=srv", "--overwrite")
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-1", "client"), "role=client", "--overwrite")
    sip = pod_ip(srv)
    until(lambda: holder(lab), "ferry-controller to hold its Lease", 120, step=0.5)
    assert settles(lab, other, sip, True), "no policy yet: other -> srv not reached"

    Policies(lab).apply(policy("srv-from-client", {"slices": "srv"},
                               ingress=[{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]))
    until(lambda: key[client.name] in received(lab, "node-3"), "the client in node-3's PeerSlices", 60, step=0.5)
    failures = []
    if not settles(lab, client, sip, True):
        failures.append("client -> srv not reached")
    if not settles(lab, other, sip, False):
        failures.append("other -> srv reached")
    seen = {n: received(lab, n) for n in ("node-1", "node-2", "node-3")}
    print(f"received: {seen}")
    if key[other.name] in seen["node-3"]:
        failures.append("node-3 received other, which no policy of it reads")
    for n in ("node-1", "node-2"):
        if seen[n] & set(key.values()):
            failures.append(f"{n} received {sorted(seen[n] & set(key.values()))}: no policy selects a Pod there")

    cluster.kubectl("label", "pod", "-n", NS, api_name("node-2", "other"), "role=client", "--overwrite")
    until(lambda: key[other.name] in received(lab, "node-3"), "other in node-3's PeerSlices once labelled", 60,
          step=0.5)
    if not settles(lab, other, sip, True):
        failures.append("other labelled role=client -> srv not reached")
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-2", "other"), "role-", "--overwrite")
    until(lambda: key[other.name] not in received(lab, "node-3"), "other out of node-3's PeerSlices", 60, step=0.5)
    if not settles(lab, other, sip, False):
        failures.append("other unlabelled -> srv still reached")
    assert not failures, "\n".join(failures)


def test_a_controller_failover_opens_no_window(lab: Lab) -> None:
    cluster = lab.kube()
    client, other, witness, srv = (lab.add_pod("node-1", "fclient"), lab.add_pod("node-2", "fother"),
                                   lab.add_pod("node-2", "fwitness"), lab.add_pod("node-3", "fsrv"))
    lab.ensure_echo(srv.netns)
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-3", "fsrv"), "failover=srv", "--overwrite")
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-1", "fclient"), "failover=client", "--overwrite")
    Policies(lab).apply(policy("fsrv-from-fclient", {"failover": "srv"},
                               ingress=[{"from": [{"podSelector": {"matchLabels": {"failover": "client"}}}]}]))
    sip = pod_ip(srv)
    assert settles(lab, client, sip, True) and settles(lab, other, sip, False), "the policy before the failover"
    leader = until(lambda: holder(lab), "ferry-controller to hold its Lease", 120, step=0.5)
    witness_key = f"{NS}/{api_name(witness.node, witness.name)}"
    with ConnectProbe(lab, other, sip, ECHO_PORT) as denied, \
            ConnectProbe(lab, client, sip, ECHO_PORT, timeout=3.0) as allowed:
        cluster.kubectl("-n", "kube-system", "delete", "pod", leader, "--wait=false")
        new = until(lambda: (h := holder(lab)) != leader and h, "another replica to take the Lease", 120, step=0.5)
        # the new leader has listed, rebuilt its book and synced: a relabel only it can carry
        # reaches node-3's slices; the probes ran across all of it
        cluster.kubectl("label", "pod", "-n", NS, api_name(witness.node, witness.name), "failover=client",
                        "--overwrite")
        until(lambda: witness_key in received(lab, "node-3"), "the new leader's first slice write", 120, step=0.5)
    print(f"failover {leader} -> {new}: denied probe {denied.tried} tried, {denied.through} through; allowed "
          f"probe {allowed.tried} tried, {allowed.failed} failed, longest blocked {allowed.longest_blocked:.2f} s")
    assert denied.tried > 0 and denied.through == 0, f"{denied.through} of {denied.tried} denied got through"
    assert allowed.tried > 0 and allowed.failed == 0, f"{allowed.failed} of {allowed.tried} allowed connections failed"
    assert settles(lab, witness, sip, True), "the witness, labelled after the failover, does not reach srv"


def delivery(lab: Lab, how: str) -> None:
    """ferry-controller rolled out again with ``--delivery how`` (what an operator changing it does)."""
    lab.kube().roll_controller_delivery(how, timeout=180)


def subscribed_slices(lab: Lab) -> list[dict]:  # type: ignore[type-arg]
    selector = f"{peerslice.DELIVERY_LABEL}={peerslice.DELIVERY_SUBSCRIPTION}"
    cp = lab.kube().kubectl("get", f"{peerslice.PLURAL}.{peerslice.GROUP}", "-l", selector, "-o", "json")
    return list(json.loads(cp.stdout)["items"])


def test_delivered_by_subscription_each_node_asks_for_the_groups_it_reads(lab: Lab) -> None:
    """``ferry-controller --delivery subscription``: every slice is rewritten with its group's label
    alone (no Node named on it), node-3's route-sync asks for its groups by name, and enforces from
    them as before; then back to labels, the same."""
    cluster = lab.kube()
    client, other, srv = (lab.add_pod("node-1", "sclient"), lab.add_pod("node-2", "sother"),
                          lab.add_pod("node-3", "ssrv"))
    lab.ensure_echo(srv.netns)
    key = {p.name: f"{NS}/{api_name(p.node, p.name)}" for p in (client, other, srv)}
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-3", "ssrv"), "sub=srv", "--overwrite")
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-1", "sclient"), "sub=client", "--overwrite")
    Policies(lab).apply(policy("ssrv-from-sclient", {"sub": "srv"},
                               ingress=[{"from": [{"podSelector": {"matchLabels": {"sub": "client"}}}]}]))
    sip = pod_ip(srv)
    delivery(lab, peerslice.DELIVERY_SUBSCRIPTION)

    def subscribed_pods() -> set[str]:
        return {p.key for obj in subscribed_slices(lab) for p in peerslice.from_object(obj).spec.pods}

    until(lambda: key[client.name] in subscribed_pods() and not received(lab, "node-3"),
          "every slice rewritten for its subscribers", 120, step=0.5)
    failures = []
    for obj in subscribed_slices(lab):
        spans = [k for k in obj["metadata"].get("labels", {}) if k.startswith(peerslice.NODE_LABEL_PREFIX)]
        if spans:
            failures.append(f"{obj['metadata']['name']} still names Nodes: {spans}")
    if not settles(lab, client, sip, True):
        failures.append("by subscription: sclient -> ssrv not reached")
    if not settles(lab, other, sip, False):
        failures.append("by subscription: sother -> ssrv reached")
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-2", "sother"), "sub=client", "--overwrite")
    if not settles(lab, other, sip, True):
        failures.append("by subscription: sother labelled sub=client -> ssrv not reached")
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-2", "sother"), "sub-", "--overwrite")
    if not settles(lab, other, sip, False):
        failures.append("by subscription: sother unlabelled -> ssrv still reached")

    delivery(lab, "labels")
    until(lambda: key[client.name] in received(lab, "node-3") and not subscribed_slices(lab),
          "every slice labelled for its Nodes again", 120, step=0.5)
    if not settles(lab, client, sip, True):
        failures.append("back to labels: sclient -> ssrv not reached")
    if not settles(lab, other, sip, False):
        failures.append("back to labels: sother -> ssrv reached")
    assert not failures, "\n".join(failures)


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


@pytest.mark.parametrize("how", peerslice.DELIVERIES)
def test_a_node_receives_no_event_for_pods_nothing_on_it_references(lab: Lab, how: str) -> None:
    """The small scale case CI runs (issue 46), in each delivery of the slices (``how``: labelled
    with their Nodes, or by subscription, each Node asking for the groups it reads, here the groups
    :func:`routesync.policy.subscription.subscribed` names, as route-sync's own tells them:
    ``test_subscription.py``, ``test_watch_peers.py``): ``FERRY_SCALE_NODES`` simulated Nodes (default 100)
    with ``FERRY_SCALE_PODS_PER_NODE`` Pods each (29, the most a simulated Node holds: 2,900 Pods)
    in the real API server (:mod:`lab.kube.simulate`); one policy isolates a real Pod on node-3 and admits the simulated
    Pods labelled ``ref=yes``, half of them.  Then churn: Pods created, deleted and relabelled,
    referenced and not, alternately.  Counted by watches with each real Node's selectors
    (:mod:`lab.kube.watchcount`), synchronised on a last referenced Pod reaching node-3:

    * node-1 and node-2 (no policy selects a Pod there) receive no event;
    * node-3 receives no event that changes a Pod it does not read, and at most one per change of
      one it reads; every referenced change arrives;
    * printed beside: the events a watch of every Pod (today's ``policyPeers: cluster``) carried
      to each Node, and API write -> node-3's slice event, p50/p99."""
    import os
    import random

    from kubernetes import config as kconfig

    from lab.kube import simulate as sim
    from lab.kube.watchcount import Watches, inputs_of
    from routesync.policy.subscription import subscribed

    nodes = int(os.environ.get("FERRY_SCALE_NODES", "100"))
    per_node = int(os.environ.get("FERRY_SCALE_PODS_PER_NODE", "29"))
    cluster = lab.kube()
    srv = lab.add_pod("node-3", f"scale-{how[:3]}")  # one per delivery: the module's lab keeps its Pods
    cluster.kubectl("label", "pod", "-n", NS, api_name("node-3", srv.name), "scale=srv", "--overwrite")
    namespaces = [f"sim-{i}" for i in range(10)]
    pods = sim.pod_objects(nodes, per_node, namespaces,
                           lambda i: {"ref": "yes" if i % 2 else "no", "app": f"a{i % 7}", "v": "0"})
    Policies(lab).apply(policy("scale-srv", {"scale": "srv"}, ingress=[{"from": [{
        "namespaceSelector": {"matchLabels": {sim.SIM_LABEL: "yes"}},
        "podSelector": {"matchLabels": {"ref": "yes"}}}]}]))
    del srv
    with sim.api_netns(cluster.plan.process("kube-apiserver").netns):
        api = kconfig.new_client_from_config(cluster.plan.admin_kubeconfig)
        s = sim.Simulator(api)

        def selectors(node: str) -> list[str]:
            """The PeerSlice selectors ``node``'s route-sync watches in this delivery."""
            if how == peerslice.DELIVERY_LABELS:
                return peerslice.node_selectors(node)
            return peerslice.group_selectors(subscribed(node, inputs_of(api)))

        if how != peerslice.DELIVERY_LABELS:
            delivery(lab, how)
        try:
            t0 = time.monotonic()
            s.create_namespaces(namespaces)
            s.create_nodes(sim.node_objects(nodes + 1))  # the last one for the Pods the churn creates
            s.create_pods(pods)
            print(f"{nodes} simulated Nodes, {len(pods)} Pods written in {time.monotonic() - t0:.1f} s")
            referenced = {f"{p.namespace}/{p.name}" for p in pods if p.labels["ref"] == "yes"}
            watched = {n: selectors(n) for n in ("node-1", "node-2", "node-3")}  # its own Pods do not churn
            until(lambda: referenced <= received(lab, "node-3", watched["node-3"]),
                  "every ref=yes Pod in node-3's slices", 300, step=1)
            watches = Watches(api)
            for n, sels in watched.items():
                watches.selected(n, sels)
            watches.every_pod()
            rng = random.Random(46)
            ops: list[tuple[str, float, bool]] = []  # (the Pod's key, API write time, referenced)
            live = {f"{p.namespace}/{p.name}": p for p in pods}
            t_churn = time.monotonic()
            churn_ips = sim.node_pod_ips(nodes)
            made = 0
            for i in range(60):
                ref = i % 2 == 0
                kind = ("create", "delete", "relabel")[(i // 2) % 3]
                want = "yes" if ref else "no"
                if kind == "create":
                    made += 1
                    p = sim.SimPod(namespaces[made % 10], f"churn-{made:03d}", sim.node_name(nodes),
                                   {"ref": want, "app": "a0", "v": "0"}, next(churn_ips))
                    t = time.monotonic()
                    s.create_pod(p)
                    live[f"{p.namespace}/{p.name}"] = p
                else:
                    key = rng.choice(sorted(k for k, q in live.items() if q.labels["ref"] == want))
                    p = live[key]
                    t = time.monotonic()
                    if kind == "delete":
                        s.delete_pod(p)
                        del live[key]
                    else:
                        s.label_pod(p, {"v": str(i)})
                ops.append((f"{p.namespace}/{p.name}", t, ref))
                time.sleep(0.05)  # pacing the churn at ~20 operations a second (no result depends on it)
            marker = sim.SimPod(namespaces[0], "churn-marker", sim.node_name(nodes), {"ref": "yes", "v": "0"},
                                next(churn_ips))
            s.create_pod(marker)
            mkey = f"{marker.namespace}/{marker.name}"
            until(lambda: any(mkey in e.changed for e in watches.since("node-3", t_churn)),
                  "the last referenced Pod in node-3's slice events", 120, step=0.2)
            watches.stop()
            assert not watches.errors, f"a watch broke, its counts are short: {watches.errors}"
            got = {n: watches.since(n, t_churn) for n in ("node-1", "node-2", "node-3", "every-pod")}
            ref_keys = {k for k, _t, r in ops if r} | {mkey}
            unref_keys = {k for k, _t, r in ops if not r}
            lat = [min((e.at for e in got["node-3"] if k in e.changed), default=float("nan")) - t
                   for k, t, r in ops if r]
            print(f"delivery {how}: churn: {len(ops)} operations ({len(ref_keys) - 1} referenced by node-3's "
                  "policy); events: "
                  f"node-1 {len(got['node-1'])}, node-2 {len(got['node-2'])}, node-3 {len(got['node-3'])} "
                  f"({sum(e.size for e in got['node-3'])} B); a watch of every Pod: {len(got['every-pod'])} "
                  f"events ({sum(e.size for e in got['every-pod'])} B) to each Node; API write -> node-3's slice "
                  f"event p50 {_pct(lat, 50) * 1000:.0f} ms, p99 {_pct(lat, 99) * 1000:.0f} ms")
            failures = []
            for n in ("node-1", "node-2"):
                if got[n]:
                    failures.append(f"{n} received {len(got[n])} events: {got[n][:3]}")
            stray = [e for e in got["node-3"] if e.changed & unref_keys or not e.changed <= ref_keys]
            if stray:
                failures.append(f"node-3 received {len(stray)} events changing Pods it does not read: {stray[:3]}")
            if len(got["node-3"]) > len(ref_keys):
                failures.append(f"node-3: {len(got['node-3'])} events for {len(ref_keys)} referenced changes")
            missed = [k for k, t, r in ops if r and not any(k in e.changed for e in got["node-3"])]
            if missed:
                failures.append(f"node-3 never received {missed}")
            assert not failures, "\n".join(failures)
        finally:
            s.delete_all()
            if how != peerslice.DELIVERY_LABELS:
                delivery(lab, peerslice.DELIVERY_LABELS)
