"""What the plugin and route-sync must agree on is declared once (docs/design/contracts.md, "Declared once"),
read from the sources (nothing is imported or run):

* ``cni/pipeline/tables.py`` holds the OVS ``external_ids`` keys and values, the cookies, port
  names; ``cni/pipeline/modes.py`` the traffic modes, peer paths, datapaths and tunnel types.  No
  other module assigns a module-level name either declares (``TUNNEL_TYPES = ...`` twice), builds
  a cookie of its own (``Cookie(Owner.NODE, 1)``), or spells an external_ids key as a literal
  (``ids.get("ferry-chained")``): a rename in one place would pass every other test and silently
  break route-sync's replay of Pods after an ovs-vswitchd restart.
* The words of modes.py are written as literals nowhere else in the code mypy checks and the lab
  (``== "tunnel"``): they are its constants, so a misspelling fails mypy or the import.
  ``ALLOWED_WORDS`` lists the literals that are another vocabulary (nftables' ``netdev`` family,
  kube-proxy's ``none`` mode, ``ip route``, the state file's ``tunnel`` key), with their count:
  a new one fails until it is listed or replaced.
* Each tuple of modes.py holds exactly the words of its ``Literal`` alias."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import REPO

SOURCES = ("cni", "routesync", "controller", "lab", "bench")
WORD_SOURCES = ("cni", "routesync", "controller", "lab")  # bench's literals are topology documents it writes
TABLES = REPO / "cni" / "pipeline" / "tables.py"
MODES = REPO / "cni" / "pipeline" / "modes.py"
DECLARING = (TABLES, MODES)

# (file, word) -> how many literals of it are another vocabulary than modes.py's
ALLOWED_WORDS = {
    ("cni/node/nodestate.py", "tunnel"): 2,  # the state file's "tunnel" key
    ("routesync/show.py", "tunnel"): 1,  # show --json's "tunnel" key
    ("routesync/show.py", "none"): 1,
    ("routesync/show.py", "wireguard"): 1,  # show --json's "wireguard" key  # show's text for "no tunnel port"
    ("routesync/model.py", "none"): 1,  # the ferry.io/transport-vlan annotation's "untagged here"
    ("routesync/apply/nft.py", "netdev"): 3,  # nftables' netdev family (the uplink's ingress table)
    ("routesync/config.py", "wireguard"): 1,  # the config's wireguard section key
    ("routesync/wireguard/kernel.py", "wireguard"): 1,  # the kernel's link kind (RTM_NEWLINK IFLA_INFO_KIND)
    ("lab/cli.py", "route"): 2,  # ip route show
    ("lab/kube/reboot.py", "route"): 2,  # ip route flush (a reboot empties the Node's routing table)
    ("lab/cli.py", "tunnel"): 1,  # the state file's "tunnel" key
    ("lab/check.py", "none"): 1,
    ("lab/topology.py", "none"): 1,  # a Node's vlan: none (untagged) on a tagged lab  # "no family" in the summary line
    ("lab/frr.py", "route"): 1,  # ip route show
    ("lab/picture.py", "tunnel"): 3,  # the state file's "tunnel" key; the legend's and label's text
    ("lab/picture.py", "underlay"): 1,  # the edge label
    ("lab/kube/cluster.py", "none"): 2,  # kube-proxy mode none
    ("lab/kube/spec.py", "none"): 2,  # kube-proxy mode none
    ("lab/kube/plan.py", "none"): 1,  # kube-proxy mode none
}


def source_files(packages: tuple[str, ...]) -> Iterator[Path]:
    for pkg in packages:
        yield from sorted((REPO / pkg).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings or bare string statements."""
    return {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}


def strings(path: Path, whole: bool) -> Iterator[str]:
    """The string literals of one file, docstrings aside; ``whole``: not the pieces of f-strings."""
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    if whole:
        for n in ast.walk(tree):
            if isinstance(n, ast.JoinedStr):
                skip |= {id(v) for v in n.values}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip:
            yield n.value


def module_constants(path: Path) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` and ``NAME: T = <literal>`` assignments (str, int, tuples of them)."""
    out: dict[str, object] = {}
    for n in ast.parse(path.read_text(), str(path)).body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        value = getattr(n, "value", None)
        for t in targets:
            if isinstance(t, ast.Name) and value is not None:
                try:
                    out[t.id] = ast.literal_eval(value)
                except ValueError:
                    out[t.id] = None  # not a literal (a Cookie, a tuple of names): the name still counts
    return out


def module_names(path: Path) -> set[str]:
    names = set()
    for n in ast.parse(path.read_text(), str(path)).body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Name):
                    names.add(e.id)
    return names


def literal_aliases(path: Path) -> dict[str, tuple[str, ...]]:
    """``Alias: TypeAlias = Literal["a", "b"]`` under ``if TYPE_CHECKING:``."""
    out = {}
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and isinstance(n.value, ast.Subscript) \
                and isinstance(n.value.value, ast.Name) and n.value.value.id == "Literal":
            s = n.value.slice
            out[n.target.id] = tuple(ast.literal_eval(e) for e in (s.elts if isinstance(s, ast.Tuple) else [s]))
    return out


def mode_words() -> set[str]:
    return {w for words in literal_aliases(MODES).values() for w in words}


def ext_values() -> dict[str, str]:
    """EXT_* name -> external_ids key."""
    return {k: v for k, v in module_constants(TABLES).items() if k.startswith("EXT_") and isinstance(v, str)}


def test_the_readers_see_the_declarations(tmp_path: Path) -> None:
    ext = ext_values()
    assert {"EXT_CHAINED", "EXT_CHAINED_GATEWAYS", "EXT_GATEWAY_MAC", "EXT_OWNER", "EXT_IPS"} <= set(ext)
    assert set(literal_aliases(MODES)) == {"Mode", "Path", "Datapath", "TunnelType", "Encryption"}
    assert {"tunnel", "encap", "noEncap", "netdev", "fast", "route", "vxlan"} <= mode_words()
    assert "UPLINK_COOKIE" in module_names(TABLES) and "MODES" in module_names(MODES)
    probe = tmp_path / "probe.py"
    probe.write_text('"""doc"""\nx = "tunnel"\ny = f"tunnel {x}"\n')
    assert list(strings(probe, whole=True)) == ["tunnel"]
    assert sorted(strings(probe, whole=False)) == ["tunnel", "tunnel "]


def test_each_tuple_holds_its_aliases_words() -> None:
    aliases = literal_aliases(MODES)
    consts = module_constants(MODES)
    words = {name: value for name, value in consts.items() if isinstance(value, str)}
    assert len(set(words.values())) == len(words), "one constant per word"
    src = ast.parse(MODES.read_text())
    for n in src.body:  # a constant that names another one's word again (ENCRYPTION_NONE = PATH_NONE)
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and isinstance(n.value, ast.Name):
            words[n.target.id] = words[n.value.id]
    tuples = {}
    for n in src.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and isinstance(n.value, ast.Tuple):
            tuples[n.target.id] = tuple(words[e.id] for e in n.value.elts if isinstance(e, ast.Name))
    assert tuples["MODES"] == aliases["Mode"]
    assert tuples["PATHS"] == aliases["Path"]
    assert tuples["DATAPATHS"] == aliases["Datapath"]
    assert tuples["TUNNEL_TYPES"] == aliases["TunnelType"]
    assert tuples["ENCRYPTIONS"] == aliases["Encryption"]
    # and at run time the module says the same
    from cni.pipeline import modes

    assert (modes.MODES, modes.PATHS, modes.DATAPATHS, modes.TUNNEL_TYPES) == \
        (aliases["Mode"], aliases["Path"], aliases["Datapath"], aliases["TunnelType"])
    assert set(modes.TUNNELLED_MODES) | set(modes.FAST_PATH_MODES) <= set(modes.MODES)
    assert set(modes.ROUTED_PATHS) <= set(modes.PATHS) and set(modes.NETDEV_TUNNEL_TYPES) <= set(modes.TUNNEL_TYPES)


def test_external_ids_keys_are_declared_once() -> None:
    ext = ext_values()
    assert len(set(ext.values())) == len(ext), f"two EXT_* names for one key: {ext}"
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(v) for v in ext.values()) + r")(?![\w-])")
    found = sorted((rel(p), m) for p in source_files(SOURCES) if p != TABLES
                   for s in strings(p, whole=False) for m in pattern.findall(s))
    assert found == [], "external_ids keys spelt as literals: import them from cni.pipeline.tables"


def test_no_module_declares_a_shared_name_again() -> None:
    declared = {name: rel(path) for path in DECLARING for name in module_names(path)
                if name.isupper() and not name.startswith("_")}
    twice = sorted((rel(p), name, declared[name]) for p in source_files(SOURCES) if p not in DECLARING
                   for name in module_names(p) if name in declared)
    assert twice == [], "declared again: import it from where it is declared"


def test_cookies_are_built_in_tables_only() -> None:
    """Every cookie value is one of tables.py's (its constants and ``pod_cookie``/``peer_cookie``)."""
    built = sorted(rel(p) for p in source_files(SOURCES) if p != TABLES
                   for n in ast.walk(ast.parse(p.read_text(), str(p)))
                   if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))
                   and (n.func.id if isinstance(n.func, ast.Name) else n.func.attr) == "Cookie")
    assert built == []


def test_mode_words_are_spelt_once() -> None:
    words = mode_words()
    found: Counter[tuple[str, str]] = Counter()
    for p in source_files(WORD_SOURCES):
        if p == MODES:
            continue
        for s in strings(p, whole=True):
            if s in words:
                found[(rel(p), s)] += 1
    unexpected = {k: n for k, n in found.items() if ALLOWED_WORDS.get(k) != n}
    gone = {k: n for k, n in ALLOWED_WORDS.items() if k not in found}
    assert unexpected == {}, "mode/path/datapath/tunnel words as literals: use cni.pipeline.modes' constants " \
        "(or list another vocabulary's word in ALLOWED_WORDS)"
    assert gone == {}, "gone: remove them from ALLOWED_WORDS"
