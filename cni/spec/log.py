"""The plugin's log: one line per event, appended to a file and (warnings up) to stderr; never stdout.

Cheap by design, because every CNI call sets it up: no ``logging`` import (it costs as much as the
rest of a VERSION call), no handler objects, the file is opened on the first line that passes the
level, each line goes out in one ``os.write`` on an ``O_APPEND`` descriptor so concurrent plugin
processes do not interleave inside a line.  If the file cannot be opened the log carries on with
stderr alone (and says so there once).

Line format::

    2024-05-01T12:00:00.123Z pid=4242 INFO ADD 3f69...d755 veth fp1a2b up on br-int
"""

from __future__ import annotations

import os
import time

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TextIO

DEFAULT_FILE = "/var/log/ferry/cni.log"
DEFAULT_LEVEL = "info"
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
NAMES = {v: k.upper() for k, v in LEVELS.items()}
STDERR_MIN = LEVELS["warning"]  # stderr is what a runtime shows a user: problems only


class Log:
    """A per-invocation log bound to one command and container ID."""

    __slots__ = ("_fd", "_file_failed", "command", "container_id", "level", "path", "stderr")

    def __init__(self, path: str, level: int, stderr: TextIO | None, command: str = "",
                 container_id: str = "") -> None:
        self.path = path  # "" = no file
        self.level = level
        self.stderr = stderr
        self.command = command or "-"
        self.container_id = container_id or "-"
        self._fd = -1
        self._file_failed = False

    def bind(self, command: str, container_id: str) -> None:
        self.command = command or "-"
        self.container_id = container_id or "-"

    def debug(self, msg: str) -> None:
        self.event(LEVELS["debug"], msg)

    def info(self, msg: str) -> None:
        self.event(LEVELS["info"], msg)

    def warning(self, msg: str) -> None:
        self.event(LEVELS["warning"], msg)

    def error(self, msg: str) -> None:
        self.event(LEVELS["error"], msg)

    def failure(self, msg: str, exc: BaseException) -> None:
        """An error with its traceback folded into the same line (`` | `` between frames)."""
        import traceback  # only when something actually broke

        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.event(LEVELS["error"], f"{msg} | {tb}")

    def event(self, level: int, msg: str) -> None:
        if level < self.level:
            return
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        text = " | ".join(part.strip() for part in msg.splitlines() if part.strip()) or "-"
        line = (f"{stamp} pid={os.getpid()} {NAMES.get(level, str(level))} "
                f"{self.command} {self.container_id} {text}\n")
        if self.path and not self._file_failed:
            self._write_file(line)
        if level >= STDERR_MIN:
            self._write_stderr(line)

    def _write_file(self, line: str) -> None:
        try:
            if self._fd < 0:
                self._fd = _open_append(self.path)
            os.write(self._fd, line.encode("utf-8", "backslashreplace"))
        except OSError as e:
            self._file_failed = True
            self._write_stderr(f"ferry: cannot write log file {self.path}: {e}; logging to stderr only\n")

    def _write_stderr(self, line: str) -> None:
        if self.stderr is None:
            return
        try:
            self.stderr.write(line)
            self.stderr.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must never turn into a failed CNI call

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1


def _open_append(path: str) -> int:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW  # a planted link is refused
    try:
        return os.open(path, flags, 0o640)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", mode=0o750, exist_ok=True)
        return os.open(path, flags, 0o640)


def settings(config: Mapping[str, Any] | None, default_file: str = DEFAULT_FILE) -> tuple[str, int, list[str]]:
    """(file, level, complaints) from a network config's ``logFile`` / ``logLevel``.

    Bad values never fail a CNI call: the default is used and the complaint is logged."""
    complaints: list[str] = []
    path, level_name = default_file, DEFAULT_LEVEL
    if config:
        raw_path = config.get("logFile", default_file)
        if isinstance(raw_path, str) and "\0" not in raw_path:
            path = raw_path  # "" turns the file off
        else:
            complaints.append(f"logFile must be a path string, got {raw_path!r:.80}; using {default_file}")
        raw_level = config.get("logLevel", DEFAULT_LEVEL)
        if isinstance(raw_level, str) and raw_level.lower() in LEVELS:
            level_name = raw_level.lower()
        else:
            complaints.append(f"logLevel must be one of {sorted(LEVELS)}, got {raw_level!r:.80}; "
                              f"using {DEFAULT_LEVEL}")
    return path, LEVELS[level_name], complaints


def open_log(config: Mapping[str, Any] | None, stderr: TextIO | None, command: str = "",
             container_id: str = "", default_file: str | None = None) -> Log:
    """The log for one invocation; nothing is opened until the first line is written."""
    path, level, complaints = settings(config, DEFAULT_FILE if default_file is None else default_file)
    log = Log(path, level, stderr, command, container_id)
    for c in complaints:
        log.warning(c)
    return log


class _Detach:
    """Undo of :func:`attach_stdlib`: removes the forwarding handler again."""

    __slots__ = ("_handler", "_logger", "_old_level", "_old_propagate")

    def __init__(self, logger: Any, handler: Any, old_level: int, old_propagate: bool) -> None:
        self._logger, self._handler = logger, handler
        self._old_level, self._old_propagate = old_level, old_propagate

    def __call__(self) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._old_level)
        self._logger.propagate = self._old_propagate


def attach_stdlib(log: Log, name: str = "ferry") -> _Detach:
    """Forward stdlib ``logging.getLogger(name)`` records (cni.commands.add, cni.commands.rollback) into ``log``.

    Called only on the paths that import those modules anyway (``logging`` is already loaded
    there); returns the undo, so an in-process caller (tests) keeps no handler behind."""
    import logging

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                msg = record.getMessage()
            except Exception:  # noqa: BLE001 - a bad format string must not fail the CNI call
                msg = f"{record.msg!r} {record.args!r}"
            if record.exc_info and record.exc_info[1] is not None:
                log.failure(msg, record.exc_info[1])
            else:
                log.event(record.levelno, msg)

    logger = logging.getLogger(name)
    handler = Forward()
    undo = _Detach(logger, handler, logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(log.level)
    logger.propagate = False  # no root/lastResort handler printing a second copy to stderr
    return undo
