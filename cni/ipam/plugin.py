"""``ferry-ipam``: Ferry IPAM as a standalone CNI IPAM plugin, and ``ferry-ipam ls``.

As a plugin (``CNI_COMMAND`` set, network config on stdin), through :mod:`cni.spec.protocol`:
ADD prints ``{ips, routes}`` (no interfaces), DEL releases, CHECK compares ``prevResult.ips`` with
the store, GC releases every attachment not in ``cni.dev/valid-attachments``, STATUS answers 50
when ADD could not be served.  Requested addresses come from ``CNI_ARGS`` ``IP=a,b`` and
``runtimeConfig.ips``.  Without ``ipam.ranges`` the Node's Pod CIDRs are read from the node
state file (``ipam.stateFile``, else the conf's ``stateFile``, else the default path).

``ferry-ipam ls [--json] [--data-dir D]`` lists the allocations of every network under D."""

from __future__ import annotations

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from cni.ipam.api import IpamConfig
    from cni.spec.request import Handlers, Request
    from cni.spec.result import Result


def _node_cidrs(config: dict[str, Any]) -> list[str]:
    ipam = config.get("ipam") if isinstance(config.get("ipam"), dict) else {}
    if isinstance(ipam, dict) and ipam.get("ranges") is not None:
        return []
    from cni.node import nodestate

    path = (ipam or {}).get("stateFile") or config.get("stateFile") or nodestate.DEFAULT_STATE_FILE
    try:
        return list(nodestate.read(str(path)).podCIDRs)
    except nodestate.StateError:
        return []


def _conf(req: Request) -> IpamConfig:
    from cni.ipam import api

    return api.parse_config(req.config, _node_cidrs(req.config))


def _requested(req: Request) -> list[str]:
    from cni.spec.errors import INVALID_CONFIG, CniError

    out = [a.strip() for a in req.args.get("IP", "").split(",") if a.strip()]
    runtime = req.config.get("runtimeConfig") or {}
    if isinstance(runtime, dict) and runtime.get("ips") is not None:
        ips = runtime["ips"]
        if not isinstance(ips, list) or not all(isinstance(x, str) for x in ips):
            raise CniError(INVALID_CONFIG, "runtimeConfig.ips must be a list of addresses")
        out += [x for x in ips if x not in out]
    return out


def _add(req: Request) -> Result:
    from cni.ipam import api
    from cni.spec.result import Result

    conf = _conf(req)
    ips = api.allocate(conf, req.container_id, req.ifname, _requested(req))
    return Result(ips=ips, routes=list(conf.routes))


def _delete(req: Request) -> None:
    from cni.ipam import api
    from cni.spec.errors import TRY_AGAIN_LATER, CniError

    try:
        conf = _conf(req)
    except CniError as e:
        if e.code == TRY_AGAIN_LATER:  # nothing could have been allocated without ranges
            return
        raise
    api.release(conf, req.container_id, req.ifname)


def _check(req: Request) -> None:
    from cni.ipam import api
    from cni.spec.errors import INVALID_CONFIG, CniError

    if req.prev_result is None:
        raise CniError(INVALID_CONFIG, "CHECK needs a prevResult")
    api.check(_conf(req), req.container_id, req.ifname, [i.address for i in req.prev_result.ips])


def _gc(req: Request) -> None:
    from cni.ipam import api

    valid = {(a["containerID"], a["ifname"]) for a in req.config.get("cni.dev/valid-attachments") or []}
    api.gc(_conf(req), valid)


def _status(req: Request) -> None:
    from cni.ipam import api
    from cni.spec.errors import NOT_READY, CniError

    try:
        conf = _conf(req)
    except CniError as e:
        raise CniError(NOT_READY, f"ipam not ready: {e.msg}") from None
    api.status(conf)


def handlers() -> Handlers:
    return {"ADD": _add, "DEL": _delete, "CHECK": _check, "GC": _gc, "STATUS": _status}


def ls(argv: list[str]) -> int:
    import argparse
    import json
    import sys

    from cni.ipam.api import DEFAULT_DATA_DIR, list_allocations
    from cni.spec.errors import CniError

    p = argparse.ArgumentParser(prog="ferry-ipam ls", description="List Ferry IPAM allocations.")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"IPAM dataDir (default {DEFAULT_DATA_DIR})")
    args = p.parse_args(argv)
    try:
        rows = list_allocations(args.data_dir)
    except CniError as e:
        print(f"ferry-ipam ls: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    cols = ("network", "containerID", "ifname", "address", "gateway")
    table = [("NETWORK", "CONTAINER", "IFNAME", "ADDRESS", "GATEWAY")] + [tuple(r[c] for c in cols) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    import os
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "ls":
        return ls(args[1:])
    from cni.spec import protocol

    stdin = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    return protocol.run(handlers(), os.environ, stdin, sys.stdout.buffer, sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
