"""Running commands, in a namespace or not: the one place lab code starts processes.

No shell anywhere: argv lists only.  Errors carry the command and its stderr."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

NETNS_DIR = "/run/netns"  # where `ip netns` keeps the namespaces it names


class LabError(RuntimeError):
    """A lab operation failed; the message says what and how to recover."""


def in_netns(netns: str | None, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def run(argv: Sequence[str], *, netns: str | None = None, env: Mapping[str, str] | None = None,
        input: str | None = None, check: bool = True, timeout: float = 30.0
        ) -> subprocess.CompletedProcess[str]:
    cmd = in_netns(netns, argv)
    try:
        cp = subprocess.run(cmd, check=False, input=input, env=dict(env) if env is not None else None,
                            capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LabError(f"timed out after {timeout}s: {' '.join(cmd)}") from None
    except FileNotFoundError as e:
        raise LabError(f"command not found: {e.filename}") from None
    if check and cp.returncode != 0:
        raise LabError(f"{' '.join(cmd)} failed (rc={cp.returncode}): {cp.stderr.strip() or cp.stdout.strip()}")
    return cp


def ip_batch(netns: str | None, lines: Sequence[str]) -> None:
    """Apply iproute2 commands in one process (``ip -batch -``), in ``netns`` when given."""
    if not lines:
        return
    argv = ["ip", "-n", netns, "-batch", "-"] if netns else ["ip", "-batch", "-"]
    run(argv, input="\n".join(lines) + "\n")


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie's namespaces are already released)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> str:
    """A process's command line, arguments joined by spaces; "" when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ns_inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def pids_in(namespaces: list[str]) -> list[int]:
    """Every process whose network namespace is one of ``namespaces`` (``ip netns pids``)."""
    wanted = {i for i in (ns_inode(os.path.join(NETNS_DIR, ns)) for ns in namespaces) if i}
    if not wanted:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ns_inode(f"/proc/{entry}/ns/net") in wanted:
            out.append(int(entry))
    return out


def pids_named(netns: str, comm: str) -> list[int]:
    """The processes in ``netns`` whose command name is ``comm`` (whoever started them: the lab,
    or a container whose pidfiles hold pids of its own PID namespace)."""
    out = []
    for pid in pids_in([netns]):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    out.append(pid)
        except OSError:
            continue
    return out
