"""The Kubernetes Node source against a local server speaking the API's wire format, for the cases
the real kube-apiserver cannot be made to produce on demand (the rest runs against the real one in
tests/e2e/kube/test_kube_api_source.py and test_kube_lifecycle.py):

* a BOOKMARK at a chosen moment (the real server sends one about once a minute, on its own clock);
* a watch dropped with no restart and no write in between (a real restart moves etcd's revision
  on its own, so the resumed watch may be answered 410 instead);
* a change that only a re-list shows (one the watch never carried), then 410;
* a list answered 500 three times in a row."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from routesync.model import MAC_ANNOTATION, TRANSPORT_ANNOTATION, NodeRecord
from routesync.sources.kube import KubeSource, record_from_node
from tests.support.kubeserver import KubeServer, make_node
from tests.support.waiting import until


@pytest.fixture
def server() -> Iterator[KubeServer]:
    with KubeServer() as s:
        s.state.put(make_node("node-a", "192.168.77.11", ["10.244.1.0/24", "fd00:10:244:1::/64"]))
        s.state.put(make_node("node-b", ["192.168.77.12", "fd00:77::12"], ["10.244.2.0/24"]))
        yield s


@pytest.fixture
def source(server: KubeServer, tmp_path) -> Iterator[KubeSource]:  # type: ignore[no-untyped-def]
    src = KubeSource.from_kubeconfig("node-a", server.kubeconfig(str(tmp_path / "kubeconfig")))
    yield src
    src.close()


def names(src: KubeSource) -> dict[str, NodeRecord]:
    return {r.name: r for r in src.list()}


def test_node_json_to_record_reads_podcidrs_internal_ips_and_ferry_annotations() -> None:
    node = make_node("n1", ["192.168.77.11", "fd00:77::11"], ["10.244.1.0/24", "fd00:10:244:1::/64"],
                     {MAC_ANNOTATION: "02:00:00:00:00:01"})
    rec = record_from_node(node)
    assert rec.transport_addresses == ("192.168.77.11", "fd00:77::11")
    assert rec.pod_cidrs == ("10.244.1.0/24", "fd00:10:244:1::/64")
    assert rec.annotations == ((MAC_ANNOTATION, "02:00:00:00:00:01"),)  # only ferry.io/*
    node["metadata"]["annotations"][TRANSPORT_ANNOTATION] = "10.0.0.5, fd00::5"
    assert record_from_node(node).transport_addresses == ("10.0.0.5", "fd00::5")


def test_bookmark_advances_version_so_resume_needs_no_relist(server: KubeServer, source: KubeSource) -> None:
    names(source)
    until(lambda: any("watch=true" in p for _, _, p in server.state.requests))
    server.state.bookmark()
    until(lambda: source.resource_version == str(server.state.rv))
    # Forget history up to the bookmark and drop the connection: resuming from the bookmark's
    # version is fine; resuming from the list's version would get 410 and a re-list.
    server.state.compact()
    server.state.drop_watches()
    until(lambda: sum("watch=true" in p for _, _, p in server.state.requests) >= 2)
    server.state.put(make_node("node-d", "192.168.77.14", ["10.244.4.0/24"]))
    until(lambda: "node-d" in names(source))
    assert source.relists == 1
    watches = [p for _, _, p in server.state.requests if "watch=true" in p]
    assert "allowWatchBookmarks=true" in watches[0]


def test_410_gone_forces_relist_and_catches_up(server: KubeServer, source: KubeSource) -> None:
    names(source)
    until(lambda: any("watch=true" in p for _, _, p in server.state.requests))
    # A change the watch never reports (lost with the compacted history), then 410.
    server.state.put(make_node("node-b", "192.168.77.77", ["10.244.2.0/24"]), record=False)
    server.state.expire_watches()
    until(lambda: source.relists == 2)
    until(lambda: names(source)["node-b"].transport_addresses == ("192.168.77.77",))
    assert source.errors == 0 and source.expired == 1  # 410 is not an error, just a re-list


def test_dropped_watch_resumes_from_its_version_without_relist(server: KubeServer, source: KubeSource) -> None:
    names(source)
    until(lambda: any("watch=true" in p for _, _, p in server.state.requests))
    server.state.put(make_node("node-c", "192.168.77.13", ["10.244.3.0/24"]))
    until(lambda: "node-c" in names(source))
    version = source.resource_version
    server.state.drop_watches(abrupt=True)  # the stream breaks (an error), not a clean end
    until(lambda: sum("watch=true" in p for _, _, p in server.state.requests) >= 2)
    resumed = [p for _, _, p in server.state.requests if "watch=true" in p][1]
    assert f"resourceVersion={version}" in resumed
    server.state.delete("node-c")
    until(lambda: "node-c" not in names(source))
    assert source.relists == 1 and source.expired == 0


def test_server_errors_back_off_then_recover(server: KubeServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server.state.fail_lists = 3
    src = KubeSource.from_kubeconfig("node-a", server.kubeconfig(str(tmp_path / "kc")))
    try:
        assert set(names(src)) == {"node-a", "node-b"}
        assert src.errors == 3
        lists = [t for t, m, p in server.state.requests if m == "GET" and "watch" not in p]
        gaps = [b - a for a, b in itertools.pairwise(lists)]
        assert len(gaps) == 3
        assert gaps[0] >= 0.18 and gaps[1] >= 0.38 and gaps[2] >= 0.78  # 0.2, 0.4, 0.8 s
    finally:
        src.close()


def test_the_api_connection_keeps_alive(server: KubeServer, source: KubeSource) -> None:
    """route-sync's connections to the API server probe with TCP keepalive (a watch whose
    conntrack entry a NAT flush removed is reset within ~30 s instead of going silent for the
    5.5 min read timeout): every socket of this process connected to the API server, the watch's
    among them, has SO_KEEPALIVE and route-sync's timings."""
    import gc
    import socket

    port = server.httpd.server_address[1]
    source.start()
    assert until(lambda: "node-b" in names(source), "the first list")

    def api_sockets() -> list[socket.socket]:
        out = []
        for o in gc.get_objects():
            if isinstance(o, socket.socket) and o.fileno() >= 0 and o.type == socket.SOCK_STREAM:
                try:
                    if o.getpeername()[1] == port:
                        out.append(o)
                except OSError:
                    pass
        return out
    live = until(api_sockets, "a connection to the API server")
    for s in live:
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 15
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3


def test_a_patched_annotation_changed_by_someone_else_is_patched_again(server: KubeServer, source: KubeSource) -> None:
    """What this source patched stands until the watch says otherwise: then the server's word
    wins, and the next publish puts Ferry's value back (not skipped as "already published")."""
    mine = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",), ((MAC_ANNOTATION, "02:00:00:00:00:0a"),))
    names(source)
    source.publish_self(mine)
    source.publish_self(mine)  # nothing new: one PATCH
    assert len(server.state.patches) == 1
    until(lambda: names(source)["node-a"].annotations == mine.annotations)
    node = server.state.nodes["node-a"]
    node["metadata"]["annotations"][MAC_ANNOTATION] = "00:00:00:00:00:02"  # someone else's edit
    server.state.put(node)
    until(lambda: dict(names(source)["node-a"].annotations)[MAC_ANNOTATION] == "00:00:00:00:00:02")
    source.publish_self(mine)
    assert len(server.state.patches) == 2


def test_a_retracted_annotation_is_deleted_and_others_left_alone(server: KubeServer, source: KubeSource) -> None:
    """An annotation route-sync took out of its record on purpose (a finished key rotation's next
    key) is deleted from the Node (a merge patch's null), once; another ``ferry.io/`` key it did
    not retract (the operator's) stays, and a retracted key the Node does not have costs no PATCH."""
    names(source)
    next_key, vlan = "ferry.io/wireguard-next-public-key", "ferry.io/transport-vlan"
    node = server.state.nodes["node-a"]
    node["metadata"].setdefault("annotations", {}).update({next_key: "bmV4dA==", vlan: "100"})
    server.state.put(node)
    until(lambda: next_key in dict(names(source)["node-a"].annotations))
    mine = NodeRecord("node-a", ("192.168.77.11",), ("10.244.1.0/24",), ((MAC_ANNOTATION, "02:00:00:00:00:0a"),),
                      retracted=frozenset((next_key,)))
    source.publish_self(mine)
    annotations = server.state.nodes["node-a"]["metadata"]["annotations"]
    assert next_key not in annotations and annotations[vlan] == "100"
    assert annotations[MAC_ANNOTATION] == mine.annotation(MAC_ANNOTATION)
    source.publish_self(mine)  # what was sent stands: nothing new
    assert len(server.state.patches) == 1
    until(lambda: next_key not in dict(names(source)["node-a"].annotations))
    source.publish_self(mine)  # the watch agrees: the key is gone, nothing to delete
    assert len(server.state.patches) == 1


def test_an_update_of_fields_ferry_does_not_read_moves_nothing(server: KubeServer, source: KubeSource) -> None:
    """A kubelet's status heartbeat is a MODIFIED event whose Node parses to the record already
    held: no change is signalled (route-sync would plan again for nothing); a change of what Ferry
    reads, after it on the same watch, is."""
    names(source)
    until(lambda: any("watch=true" in p for _, _, p in server.state.requests))
    before = source.reflector.generation
    heartbeat = make_node("node-b", ["192.168.77.12", "fd00:77::12"], ["10.244.2.0/24"])
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2024-05-01T10:06:00Z"
    server.state.put(heartbeat)
    moved = make_node("node-b", ["192.168.77.99", "fd00:77::12"], ["10.244.2.0/24"])
    server.state.put(moved)
    until(lambda: names(source)["node-b"].transport_addresses == ("192.168.77.99", "fd00:77::12"))
    # events arrive in order: the heartbeat was seen (and counted) before the address change
    assert source.reflector.unchanged == 1
    assert source.reflector.generation == before + 1


def test_service_cidrs_fall_back_to_the_config_where_the_api_serves_none(server: KubeServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An API server without ServiceCIDRs (before Kubernetes 1.33; this stand-in serves Nodes only,
    and answers 404 for the rest, as the real one does for a resource it lacks): the reflector
    says so once, and policy takes route-sync's ``serviceCIDRs``."""
    from routesync.policy.watch import PolicySource
    from routesync.sources.kube import api_client

    policy = PolicySource(api_client(server.kubeconfig(str(tmp_path / "kubeconfig"))))
    try:
        assert policy.service_cidrs(("10.96.0.0/12",)) == ("10.96.0.0/12",)
        assert policy.service_cidr_objects.unserved.is_set()
        assert policy.service_cidr_objects.errors == 0  # not retried as a failure
    finally:
        policy.close()


def test_reconnect_opens_the_watch_again_from_its_version(server: KubeServer, source: KubeSource) -> None:
    """What route-sync does once the uplink moved onto the bridge: the watch it holds is ended
    and opened again from the version it reached, without a re-list, and carries what follows."""
    names(source)
    until(lambda: any("watch=true" in p for _, _, p in server.state.requests))
    server.state.put(make_node("node-c", "192.168.77.13", ["10.244.3.0/24"]))
    until(lambda: "node-c" in names(source))
    version = source.resource_version
    source.reconnect()
    until(lambda: sum("watch=true" in p for _, _, p in server.state.requests) >= 2)
    assert f"resourceVersion={version}" in [p for _, _, p in server.state.requests if "watch=true" in p][1]
    server.state.delete("node-c")
    until(lambda: "node-c" not in names(source))
    assert source.reflector.reconnects == 1 and source.relists == 1 and source.errors == 0
