"""The documentation stays navigable: read from the files, nothing is imported or run.

* Every relative link in the repository's Markdown files (``README.md``, ``lab/README.md``,
  ``docs/**/*.md``, any other ``*.md`` git knows of) names a file or folder that exists, and where
  it has a ``#anchor`` into a Markdown file, that file has a heading whose GitHub slug is the
  anchor.  A section moved or renamed fails here, naming every link it left dangling.
* The table of test folders in ``docs/design/tests.md`` matches ``tests/``: every path it names
  exists, and every folder under ``tests/`` that holds ``test_*.py`` (and each such file at the top
  of ``tests/``) is named in it, so a new suite cannot land without a line saying what it tests."""

from __future__ import annotations

import posixpath
import re
import subprocess
import unicodedata
from pathlib import Path
from urllib.parse import unquote

from tests.support.paths import REPO

TESTS_DOC = REPO / "docs" / "design" / "tests.md"
# Files the link check must see, or it would pass by reading nothing.
REQUIRED = ("README.md", "lab/README.md", "docs/design/README.md", "docs/design/tests.md")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


SKIP_DIRS = ("build", "dist", "node_modules")  # outside a git checkout: what is never documentation


def markdown_files() -> list[Path]:
    """Every *.md git tracks, or would (untracked files not ignored too: a new page is checked
    before its commit); outside a git checkout, every *.md but in hidden and build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return sorted(f for f in REPO.rglob("*.md")
                      if not any(part.startswith(".") or part in SKIP_DIRS
                                 for part in f.relative_to(REPO).parts[:-1]))
    return sorted({REPO / line for line in out.splitlines() if line and (REPO / line).is_file()})


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    kept, fence = [], ""
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            continue
        if m:
            fence = m.group(1)
            continue
        kept.append((number, line))
    return kept


def heading_text(raw: str) -> str:
    """A heading's text as GitHub renders it: code spans keep their content, links and images their
    text, HTML tags and emphasis markers go."""
    parts = []
    pos = 0
    for m in CODE_SPAN.finditer(raw):
        parts.append(_inline(raw[pos:m.start()]))
        parts.append(m.group(2).strip())
        pos = m.end()
    parts.append(_inline(raw[pos:]))
    return "".join(parts)


def _inline(s: str) -> str:
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", s)  # [text](url), ![alt](url)
    s = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", s)  # [text][ref]
    s = re.sub(r"<[^>]+>", "", s)  # HTML tags
    return re.sub(r"(?<!\w)_+|_+(?!\w)", "", s)  # _emphasis_ (an underscore inside a word stays)


def slugify(text: str) -> str:
    """GitHub's anchor for a heading (github-slugger): lowercase; drop every character that is not
    a letter, mark, number, connector (``_``), hyphen or space; each space becomes a hyphen."""
    kept = (c for c in text.lower()
            if unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc" or c in "- ")
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a Markdown file defines: one per heading, a repeated slug suffixed -1, -2, ... in
    order (and never colliding with a slug already taken), plus explicit ``<a name|id="...">``."""
    seen: dict[str, int] = {}
    for _number, line in prose_lines(text):
        m = ATX.match(line)
        if not m:
            continue
        slug = original = slugify(heading_text(m.group(2) or ""))
        while slug in seen:
            seen[original] += 1
            slug = f"{original}-{seen[original]}"
        seen[slug] = 0
    return set(seen) | set(HTML_ANCHOR.findall(text))


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition in prose (not in
    code blocks or code spans)."""
    found = []
    for number, line in prose_lines(text):
        line = CODE_SPAN.sub("", line)
        found += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
        found += [(number, m.group(1)) for m in REFERENCE_DEF.finditer(line)]
    return [(number, target[1:-1] if target.startswith("<") else target) for number, target in found]


def broken_links(md: Path, anchor_cache: dict[Path, set[str]]) -> list[str]:
    problems = []
    rel = md.relative_to(REPO)
    for number, target in links(md.read_text()):
        if not target or SCHEME.match(target):
            continue  # http:, https:, mailto: ... are not this test's business
        path_part, _, anchor = target.partition("#")
        path_part, anchor = unquote(path_part), unquote(anchor)
        if not path_part:
            dest = md
        elif path_part.startswith("/"):
            dest = REPO / path_part.lstrip("/")
        else:
            dest = md.parent / path_part
        dest = Path(posixpath.normpath(dest))
        where = f"{rel}:{number}: ({target})"
        if not dest.exists():
            problems.append(f"{where}: {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest} does not exist")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md":
            if dest not in anchor_cache:
                anchor_cache[dest] = anchors(dest.read_text())
            if anchor not in anchor_cache[dest]:
                problems.append(f"{where}: no heading in {dest.relative_to(REPO)} has the slug {anchor!r}")
    return problems


def test_markdown_links_resolve() -> None:
    files = markdown_files()
    names = {str(f.relative_to(REPO)) for f in files}
    assert set(REQUIRED) <= names, f"not found by git ls-files: {sorted(set(REQUIRED) - names)}"
    old = (REPO / "docs" / "design").with_suffix(".md")  # the one-file design doc, split into docs/design/
    assert not old.exists(), f"{old.relative_to(REPO)} is split into docs/design/: no stale copy"
    cache: dict[Path, set[str]] = {}
    problems = [p for md in files for p in broken_links(md, cache)]
    assert not problems, "broken Markdown links:\n" + "\n".join(problems)


# ------------------------------------------------------------------ the tests table


def expand_braces(pattern: str) -> list[str]:
    """``a/{b,c}/`` → ``a/b/``, ``a/c/`` (shell style, any number of groups, none nested; an empty
    alternative stands for the folder itself)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",")
            for x in expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


def table_paths(text: str) -> list[str]:
    """The paths named in the first column of the table headed ``| folder | ...``."""
    rows = [line for _n, line in prose_lines(text) if line.lstrip().startswith("|")]
    header = next((i for i, line in enumerate(rows) if line.strip("| ").split("|")[0].strip() == "folder"), None)
    assert header is not None, f"{TESTS_DOC.relative_to(REPO)} has no table headed | folder | ..."
    paths = []
    for line in rows[header + 2:]:  # past the header and its |---| line
        first = line.strip().strip("|").split("|")[0]
        paths += [p for span in re.findall(r"`([^`]+)`", first) for p in expand_braces(span)]
    return paths


def test_the_helpers_read_markdown_as_github_does() -> None:
    """The helpers read what the table writes (so the table test below is not vacuous)."""
    assert expand_braces("tests/routesync/{,apply,bgp}/") == ["tests/routesync//", "tests/routesync/apply/",
                                                              "tests/routesync/bgp/"]
    assert expand_braces("a/{b,c}/{d,e}") == ["a/b/d", "a/b/e", "a/c/d", "a/c/e"]
    assert slugify(heading_text("A real Kubernetes cluster: `ferry-lab up --kubernetes` (`make demo-k8s`)")) \
        == "a-real-kubernetes-cluster-ferry-lab-up---kubernetes-make-demo-k8s"
    assert slugify(heading_text("Services (issue 26; `conntrack_flows`, [the _flows_](x.md))")) \
        == "services-issue-26-conntrack_flows-the-flows"
    assert anchors("# A\n## A\n```\n# A\n```\n### A\n# A-1\n") == {"a", "a-1", "a-2", "a-1-1"}


def test_tests_table_matches_the_tests_folder() -> None:
    named = table_paths(TESTS_DOC.read_text())
    assert named, "the tests table names no path"
    missing = [p for p in named if not (REPO / p).exists() or (p.endswith("/") and not (REPO / p).is_dir())]
    normalized = {posixpath.normpath(p) for p in named}
    tests = REPO / "tests"
    wanted = {str(f.parent.relative_to(REPO)) for f in tests.rglob("test_*.py") if f.parent != tests}
    wanted |= {str(f.relative_to(REPO)) for f in tests.glob("test_*.py")}
    unnamed = sorted(wanted - normalized)
    assert not missing and not unnamed, (
        f"{TESTS_DOC.relative_to(REPO)}'s table and tests/ disagree:\n"
        + "".join(f"  named, does not exist: {p}\n" for p in missing)
        + "".join(f"  holds tests, not named: {p}\n" for p in unnamed))
