"""Where route-sync learns about Nodes: one interface, two implementations.

* :class:`routesync.sources.registry.RegistrySource`: a shared directory, one YAML file per Node
  (one machine, the lab, bare metal).
* :class:`routesync.sources.kube.KubeSource`: Kubernetes Node objects (list + watch).

A source keeps the current set of Nodes; the daemon calls :meth:`NodeSource.list` to get it,
blocks in :meth:`NodeSource.wait_for_change` between reconciles and writes its own Node with
:meth:`NodeSource.publish_self`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import NodeSource, SourceError, validate_record

__all__ = ["NodeSource", "SourceError", "make_source", "validate_record"]

if TYPE_CHECKING:
    from ..config import Config


def make_source(config: Config) -> NodeSource:
    sc = config.node_source
    if sc.type == "kubernetes":
        from .kube import KubeSource

        return KubeSource.from_kubeconfig(config.node_name, sc.kubeconfig)
    from .registry import RegistrySource

    return RegistrySource(sc.registry_dir, config.node_name, poll_interval=sc.poll_interval)
