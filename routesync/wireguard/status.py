"""``ferry-route-sync show``'s WireGuard part: the plan-level status route-sync writes
(:mod:`.node`: implementation, keys, refused and waiting peers, what the encryption replaces)
joined with what the device says now (handshakes, bytes)."""

from __future__ import annotations

import json
from typing import Any

from routesync.config import Config

from .model import KERNEL
from .node import status_path


def gather(config: Config, state_file: str) -> dict[str, Any]:
    """The status file (``{"error": ...}`` when absent) and the device's live peers."""
    try:
        with open(status_path(state_file)) as f:
            doc: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"no WireGuard status ({e}): is route-sync running?"}
    live: dict[str, Any] = {}
    try:
        if doc.get("implementation") == KERNEL:
            from .wgtool import WgTool

            state = WgTool().read(config.wireguard.interface)
        else:
            from .uapi import Uapi

            state = Uapi(config.wireguard.run_dir).read(config.wireguard.interface)
        live = {p.public_key: {"endpoint": p.endpoint, "lastHandshake": p.last_handshake, "rxBytes": p.rx_bytes,
                               "txBytes": p.tx_bytes} for p in state.peers}
        doc["device"] = "up"
    except (LookupError, OSError) as e:
        doc["device"] = f"not reachable: {e}"
    for p in doc.get("peers", []):
        p.update(live.get(p["publicKey"], {}))
    return doc


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "never"
    return f"{max(0.0, now - t):.0f}s ago"


def as_table(doc: dict[str, Any], now: float) -> str:
    if "error" in doc:
        return f"wireguard: {doc['error']}\n"
    out = (f"wireguard {doc.get('interface')} ({doc.get('implementation')}, device {doc.get('device')})  "
           f"port {doc.get('listenPort')}  public key {doc.get('publicKey')}\n")
    if doc.get("rotating"):
        out += f"  key rotation under way: every Node switches at {float(doc['rotating']):.3f}\n"
    replaced = doc.get("replaces") or {}
    if replaced:
        out += "  encrypted instead of: " + ", ".join(f"{n} {p}" for n, p in sorted(replaced.items())) + "\n"
    for p in doc.get("peers", []):
        out += (f"  peer {p['node']}  {p.get('endpoint') or '-'}  allowed {','.join(p['allowedIPs']) or '-'}  "
                f"handshake {_ago(p.get('lastHandshake'), now)}  rx {p.get('rxBytes', 0)} tx {p.get('txBytes', 0)}\n")
    for r in doc.get("refused", []):
        out += f"  refused {r['node']}: {r['reason']} (its Pods are not reachable; nothing is sent in clear)\n"
    for n in doc.get("waiting", []):
        out += f"  waiting for {n}: no public key published yet (its Pods are not reachable until it does)\n"
    return out
