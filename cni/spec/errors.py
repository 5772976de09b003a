"""CNI errors: the spec's codes and Ferry's own (>= 100), raised anywhere, printed once by the protocol core."""

from __future__ import annotations

# The CNI spec's well-known error codes.
INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
NOT_READY = 50  # STATUS: the plugin cannot serve ADD now
LIMITED_CONNECTIVITY = 51  # STATUS: degraded, ADD possible

# Ferry's own codes (the spec reserves 100+ for plugins).
INTERNAL = 100
OVS_FAILURE = 101
NETLINK_FAILURE = 102
IPAM_EXHAUSTED = 110
IPAM_FAILURE = 111
INTERFACE_EXISTS = 120
NETNS_GONE = 121
CHECK_FAILED = 130  # CHECK found the attachment diverged from prevResult


class CniError(Exception):
    """An error the plugin reports as ``{cniVersion, code, msg, details}`` on stdout.

    A plain class: the error path should cost no more than VERSION (no ``dataclasses``)."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CniError):
            return NotImplemented
        return (self.code, self.msg, self.details) == (other.code, other.msg, other.details)

    __hash__ = Exception.__hash__

    def __repr__(self) -> str:
        return f"CniError(code={self.code!r}, msg={self.msg!r}, details={self.details!r})"

    def __str__(self) -> str:
        return f"[{self.code}] {self.msg}" + (f": {self.details}" if self.details else "")
