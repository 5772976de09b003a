"""networkPolicyOnly: Ferry chained after the cluster's primary CNI (ADD with ``prevResult``).

Not implemented yet: being written (issue 6, networkPolicyOnly bullet)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni.config import NodeContext, PluginConfig
    from cni.request import Request
    from cni.result import Result

from cni.errors import INVALID_CONFIG, CniError


def add(req: Request, conf: PluginConfig, node: NodeContext) -> Result:
    raise CniError(INVALID_CONFIG, "networkPolicyOnly: chaining ferry after the primary CNI is not supported yet")


def delete(req: Request, conf: PluginConfig, node: NodeContext) -> None:
    raise CniError(INVALID_CONFIG, "networkPolicyOnly: chaining ferry after the primary CNI is not supported yet")
