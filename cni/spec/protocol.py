"""The CNI protocol core: environment + stdin in, one JSON document (or nothing) on stdout, exit code.

Every Ferry CNI command goes through :func:`run`.  It follows the CNI spec (0.4.0, 1.0.0, 1.1.0):

* ``CNI_COMMAND`` is ADD, DEL, CHECK, VERSION, STATUS or GC; the variables each needs must be set
  and non-empty (``REQUIRED_ENV``), else error 4 naming them.
* The network config on stdin is a JSON object (else 6) with string ``cniVersion``, ``name`` and
  ``type`` (else 7 naming the field); its version must be one we support (else 1), and CHECK needs
  >= 0.4.0, STATUS and GC >= 1.1.0 (else 1).
* ``CNI_CONTAINERID``, ``CNI_IFNAME``, ``CNI_NETNS`` and ``CNI_ARGS`` are validated (else 4 naming
  the variable), ``prevResult`` is decoded (else 6), GC's ``cni.dev/valid-attachments`` checked (else 7).
* ADD prints the handler's Result in the config's version; the other commands print nothing on
  success.  Failures print ``{cniVersion, code, msg, details}`` and exit 1: a handler's
  :class:`~cni.spec.errors.CniError` as is, anything else as code 100 with a one-line message (the
  traceback goes to the log).  stdout never carries anything else.

VERSION is answered without importing more than ``json``: podman calls it before every ADD/DEL.
"""

from __future__ import annotations

from cni.lean import fastjson as json  # json's regexes cost as much as the interpreter start
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, BinaryIO, TextIO

    from cni.spec.errors import CniError
    from cni.spec.log import Log
    from cni.spec.request import Handlers, Request

# Must equal cni.spec.result.SUPPORTED_VERSIONS (a test holds them together); repeated here so that
# VERSION imports nothing beyond this module (cni.spec.result brings cni.lean.record, cni.lean.addr, cni.spec.errors).
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
NEWEST = SUPPORTED_VERSIONS[-1]

COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")
_ATTACH = ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH")
REQUIRED_ENV: dict[str, tuple[str, ...]] = {
    "ADD": _ATTACH,
    "CHECK": _ATTACH,
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),  # the netns may already be gone
    "GC": ("CNI_PATH",),
    "STATUS": (),
    "VERSION": (),
}
# The first spec version that has the command.
MIN_VERSION: dict[str, tuple[int, int, int]] = {"CHECK": (0, 4, 0), "STATUS": (1, 1, 0), "GC": (1, 1, 0)}
# Commands whose config may carry a prevResult to decode (ADD: when chained after another plugin).
PREV_RESULT_COMMANDS = ("ADD", "CHECK", "DEL")
VALID_ATTACHMENTS = "cni.dev/valid-attachments"
# libcni (1.1.x) sends both keys, because an early 1.1 spec draft named it this way.
LEGACY_ATTACHMENTS = "cni.dev/attachments"

IFNAMSIZ = 16  # the kernel's limit, NUL included
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_ID_REST = _ALNUM | frozenset("_.-")
_SHOW = 80  # how much of a bad value an error message quotes


# --------------------------------------------------------------------------------------------
# Validation of single values: pure functions returning a complaint ("" when fine).

def container_id_problem(value: str) -> str:
    """The spec's ``^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$``."""
    if not value:
        return "is empty"
    if value[0] not in _ALNUM or not all(c in _ID_REST for c in value):
        return f"{value!r:.{_SHOW}} must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$"
    return ""


def ifname_problem(value: str) -> str:
    """Non-empty, at most 15 bytes, not ``.``/``..``, no ``/``, ``:``, NUL or whitespace."""
    if not value:
        return "is empty"
    if len(value.encode("utf-8", "surrogateescape")) > IFNAMSIZ - 1:
        return f"{value!r:.{_SHOW}} is longer than {IFNAMSIZ - 1} bytes"
    if value in (".", ".."):
        return f"{value!r} is not a usable interface name"
    for c in value:
        if c in "/:\0" or c.isspace():
            return f"{value!r:.{_SHOW}} contains {c!r}"
    return ""


def netns_problem(value: str) -> str:
    if "\0" in value:
        return "contains a NUL byte"
    if not value.startswith("/"):
        return f"{value!r:.{_SHOW}} is not an absolute path"
    return ""


def network_name_problem(value: str) -> str:
    """Network names follow the container ID's pattern (spec, section 1)."""
    return container_id_problem(value)


def parse_cni_args(value: str) -> dict[str, str] | str:
    """``K=V;K2=V2`` as a dict, or a complaint.  Empty segments (a trailing ``;``) are ignored."""
    out: dict[str, str] = {}
    for pair in value.split(";"):
        if not pair:
            continue
        key, eq, val = pair.partition("=")
        if not eq or not key.strip():
            return f"invalid pair {pair!r:.{_SHOW}} (want KEY=VALUE;KEY2=VALUE2)"
        out[key.strip()] = val
    return out


def version_tuple(value: str) -> tuple[int, int, int] | None:
    parts = value.split(".")
    if len(parts) != 3 or not all(p.isdigit() and p.isascii() for p in parts):
        return None
    return (int(parts[0]), int(parts[1]), int(parts[2]))


# --------------------------------------------------------------------------------------------
# stdin

def load_config(stdin: bytes) -> tuple[Any, str]:
    """(decoded JSON, "") or (None, why it is not JSON)."""
    if not stdin.strip():
        return None, "empty network configuration on stdin"
    try:
        return json.loads(stdin), ""
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too deep
        return None, f"malformed network configuration on stdin: {_one_line(e)}"


def config_version(config: Any) -> str:
    """The config's cniVersion when it is a well-formed version string, else ""."""
    if isinstance(config, dict):
        v = config.get("cniVersion")
        if isinstance(v, str) and version_tuple(v) is not None:
            return v
    return ""


# --------------------------------------------------------------------------------------------
# The request

def parse_request(environ: Mapping[str, str], stdin: bytes) -> Request:
    """The validated request; :class:`~cni.spec.errors.CniError` naming the bad variable or field."""
    config, why = load_config(stdin)
    return _parse(environ, config, why)


def _parse(environ: Mapping[str, str], config: Any, decode_problem: str) -> Request:
    from cni.spec import errors

    def fail(code: int, msg: str, details: str = "") -> CniError:
        return errors.CniError(code, msg, details)

    command = environ.get("CNI_COMMAND", "")
    if not command:
        raise fail(errors.INVALID_ENV, "required env variable CNI_COMMAND is missing",
                   "one of " + ", ".join(COMMANDS))
    if command not in REQUIRED_ENV:
        raise fail(errors.INVALID_ENV, f"CNI_COMMAND {command!r:.{_SHOW}} is not a CNI command",
                   "one of " + ", ".join(COMMANDS))
    if command == "VERSION":
        from cni.spec.request import Request

        return Request(command="VERSION", cni_version=_version_answer(config))

    missing = [name for name in REQUIRED_ENV[command] if not environ.get(name)]
    if missing:
        raise fail(errors.INVALID_ENV, f"required env variables [{','.join(missing)}] missing for {command}")

    # The network configuration.
    if decode_problem:
        raise fail(errors.DECODE_FAILURE, decode_problem)
    if not isinstance(config, dict):
        raise fail(errors.DECODE_FAILURE,
                   f"network configuration must be a JSON object, not {type(config).__name__}")
    for key in ("cniVersion", "name", "type"):
        if key not in config:
            raise fail(errors.INVALID_CONFIG, f"network configuration field {key!r} is missing")
        if not isinstance(config[key], str) or not config[key]:
            raise fail(errors.INVALID_CONFIG,
                       f"network configuration field {key!r} must be a non-empty string")
    version: str = config["cniVersion"]
    if version not in SUPPORTED_VERSIONS:
        raise fail(errors.INCOMPATIBLE_VERSION,
                   f"cniVersion {version!r:.{_SHOW}} is not supported",
                   "supported versions: " + ", ".join(SUPPORTED_VERSIONS))
    least = MIN_VERSION.get(command)
    vt = version_tuple(version)
    if least is not None and vt is not None and vt < least:
        raise fail(errors.INCOMPATIBLE_VERSION,
                   f"config version {version} does not allow {command} "
                   f"(needs cniVersion >= {'.'.join(map(str, least))})")
    problem = network_name_problem(config["name"])
    if problem:
        raise fail(errors.INVALID_CONFIG, f"network configuration field 'name': {problem}")

    # The rest of the environment.
    container_id = environ.get("CNI_CONTAINERID", "")
    ifname = environ.get("CNI_IFNAME", "")
    netns = environ.get("CNI_NETNS", "")
    if container_id and (problem := container_id_problem(container_id)):
        raise fail(errors.INVALID_ENV, f"CNI_CONTAINERID {problem}")
    if ifname and (problem := ifname_problem(ifname)):
        raise fail(errors.INVALID_ENV, f"CNI_IFNAME {problem}")
    if netns and (problem := netns_problem(netns)):
        raise fail(errors.INVALID_ENV, f"CNI_NETNS {problem}")
    args = parse_cni_args(environ.get("CNI_ARGS", ""))
    if isinstance(args, str):
        raise fail(errors.INVALID_ENV, f"CNI_ARGS: {args}")
    path = [p for p in environ.get("CNI_PATH", "").split(":") if p]

    prev_result = None
    if command in PREV_RESULT_COMMANDS and config.get("prevResult") is not None:
        from cni.spec.result import decode

        prev_result = decode(config["prevResult"], "prevResult")
    if command == "GC":
        config = dict(config)
        config[VALID_ATTACHMENTS] = _valid_attachments(config)

    from cni.spec.request import Request  # only now: an input error never pays for request/result

    return Request(command=command, cni_version=version, container_id=container_id, netns=netns,
                   ifname=ifname, args=args, path=path, config=config, prev_result=prev_result)


def _valid_attachments(config: dict[str, Any]) -> list[dict[str, str]]:
    """GC's list of attachments to keep, checked; ``null`` means none.

    A config without the key is refused: reading its absence as "keep nothing" would tear down
    every Pod on the Node."""
    from cni.spec import errors

    key = VALID_ATTACHMENTS if VALID_ATTACHMENTS in config else LEGACY_ATTACHMENTS
    if key not in config:
        raise errors.CniError(errors.INVALID_CONFIG,
                              f"network configuration field {VALID_ATTACHMENTS!r} is missing (GC)")
    raw = config[key]
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise errors.CniError(errors.INVALID_CONFIG, f"{key!r} must be a list")
    out = []
    for n, item in enumerate(raw):
        where = f"{key}[{n}]"
        if not isinstance(item, dict):
            raise errors.CniError(errors.INVALID_CONFIG, f"{where!r} must be an object")
        cid, ifname = item.get("containerID"), item.get("ifname")
        if not isinstance(cid, str) or (problem := container_id_problem(cid)):
            shown = problem if isinstance(cid, str) else "must be a string"
            raise errors.CniError(errors.INVALID_CONFIG, f"{where}.containerID {shown}")
        if not isinstance(ifname, str) or (problem := ifname_problem(ifname)):
            shown = problem if isinstance(ifname, str) else "must be a string"
            raise errors.CniError(errors.INVALID_CONFIG, f"{where}.ifname {shown}")
        out.append({"containerID": cid, "ifname": ifname})
    return out


def _version_answer(config: Any) -> str:
    """VERSION answers in the config's version when we speak it, else the newest."""
    v = config_version(config)
    return v if v in SUPPORTED_VERSIONS else NEWEST


def version_document(config: Any) -> dict[str, Any]:
    return {"cniVersion": _version_answer(config), "supportedVersions": list(SUPPORTED_VERSIONS)}


def error_document(cni_version: str, code: int, msg: str, details: str = "") -> dict[str, Any]:
    return {"cniVersion": cni_version or NEWEST, "code": code, "msg": msg, "details": details}


# --------------------------------------------------------------------------------------------
# The entry point

def run(handlers: Handlers, environ: Mapping[str, str], stdin: bytes, stdout: BinaryIO,
        stderr: TextIO | None, *, log_file: str | None = None) -> int:
    """Serve one CNI invocation; the exit code (0 success, 1 failure).

    ``log_file`` replaces the default log file (the config's ``logFile`` still wins)."""
    from cni.spec.log import open_log

    command = environ.get("CNI_COMMAND", "")
    config, decode_problem = load_config(stdin)
    log = open_log(config if isinstance(config, dict) else None, stderr, command,
                   environ.get("CNI_CONTAINERID", ""), default_file=log_file)
    try:
        if command == "VERSION":  # the fast path: nothing beyond json and the log
            log.debug("VERSION")
            return _emit(stdout, version_document(config), log, 0)
        return _serve(handlers, environ, config, decode_problem, stdout, log)
    except Exception as e:  # noqa: BLE001 - a bug in the core itself: still one JSON document
        log.failure("protocol core failed", e)
        doc = error_document(config_version(config), _internal_code(), _one_line(e))
        return _emit(stdout, doc, log, 1)
    finally:
        log.close()


def _serve(handlers: Handlers, environ: Mapping[str, str], config: Any, decode_problem: str,
           stdout: BinaryIO, log: Log) -> int:
    from cni.spec import errors

    version = config_version(config)
    try:
        req = _parse(environ, config, decode_problem)
        version = req.cni_version or version
        handler = handlers.get(req.command)
        if handler is None:
            raise errors.CniError(errors.INTERNAL, f"{req.command} is not implemented by this plugin")
        log.info(f"start netns={req.netns or '-'} ifname={req.ifname or '-'}")
        req.log = log  # handlers log through the invocation's Log (no stdlib ``logging`` import)
        detach = None
        if req.command == "GC":  # IPAM's GC reports through stdlib logging; a rare path
            from cni.spec.log import attach_stdlib

            detach = attach_stdlib(log)
        try:
            result = handler(req)
        finally:
            if detach is not None:
                detach()
        if req.command == "ADD":
            if result is None:
                raise errors.CniError(errors.INTERNAL, "ADD produced no result")
            doc = result.encode(req.cni_version)
            log.info("done: " + json.dumps(doc, compact=True))
            return _emit(stdout, doc, log, 0)
        log.info("done")
        return 0
    except errors.CniError as e:
        code = e.code if isinstance(e.code, int) and not isinstance(e.code, bool) and e.code > 0 \
            else errors.INTERNAL
        msg = str(e.msg) if e.msg else f"error {code}"
        details = e.details if isinstance(e.details, str) else str(e.details)
        log.error(f"error {code}: {msg}" + (f" ({details})" if details else ""))
        return _emit(stdout, error_document(version, code, msg, details), log, 1)
    except Exception as e:  # noqa: BLE001 - the spec: any failure is a JSON error, never a traceback
        log.failure("internal error", e)
        return _emit(stdout, error_document(version, errors.INTERNAL, _one_line(e)), log, 1)


def _emit(stdout: BinaryIO, doc: dict[str, Any], log: Log, code: int) -> int:
    try:
        data = json.dumps(doc).encode("ascii") + b"\n"
    except (TypeError, ValueError) as e:  # a result that is not JSON: report instead
        log.failure("cannot encode the answer", e)
        data = json.dumps(error_document(str(doc.get("cniVersion", "")), _internal_code(),
                                         _one_line(e))).encode("ascii") + b"\n"
        code = 1
    try:
        stdout.write(data)
        stdout.flush()
    except (OSError, ValueError) as e:
        log.error(f"cannot write the answer to stdout: {_one_line(e)}")
        return 1
    return code


def _internal_code() -> int:
    from cni.spec.errors import INTERNAL

    return INTERNAL


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or "(no message)"
    line = f"{type(e).__name__}: {text}"
    return line if len(line) <= limit else line[: limit - 3] + "..."
