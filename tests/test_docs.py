"""The documentation holds together, without a server: every relative link and anchor in README.md
and docs/*.md resolves to a file (and heading) of the repository; every ``make``, ``xmc`` and
``python -m`` command they name exists (targets from the Makefile, subcommands and options from the
click group of the ``xmc`` entry point); every citation of a docs page in the code names a page and
heading that exist, and nothing cites a document outside the repository."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Iterator
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
"""The README is a front door (issue 18): what it is, why, the two commands, a tour, links."""

CODE_DIRS = ("xmc_resumption", "workflows", "activities", "bench", "tests", "deploy", "scripts", ".ci")
CODE_FILES = ("worker.py", "docker-compose.yml", "pyproject.toml", "Makefile")
CODE_SUFFIXES = {".py", ".lua", ".yml", ".yaml", ".toml", ".conf", ""}

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
MAKE = re.compile(r"(?<![\w./-])make ([a-z][\w-]*)")
XMC = re.compile(r"(?<![\w./-])xmc((?: [^|;&]*)?)")
PYTHON_M = re.compile(r"(?<![\w-])python3? -m ([A-Za-z_][\w.]*)")
CITATION = re.compile(r"docs/([\w-]+\.md)(?:,\s*\"([^\"]+)\")?")
OUTSIDE = re.compile(r"DESIGN\.md|DESIGN section|TEMPORAL_NOTES|PACING_NOTES|shared/|README, \"")


def split(text: str) -> tuple[list[str], list[str]]:
    """``text`` as (prose lines, code lines): fenced blocks go to code, the rest to prose."""
    prose: list[str] = []
    code: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces
    to ``-``; links and code marks reduced to their text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def headings(page: Path) -> tuple[str, ...]:
    """The headings of ``page`` as written (outside code blocks)."""
    prose, _ = split(page.read_text())
    return tuple(m.group(2) for line in prose if (m := HEADING.match(line)))


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors GitHub gives the headings of ``page``; a repeated one gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(page):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(page: Path) -> Iterator[str]:
    """Every link target of ``page``'s prose (inline code and code blocks left out)."""
    prose, _ = split(page.read_text())
    for line in prose:
        bare = INLINE_CODE.sub("", line)
        yield from (m.group(1) for m in LINK.finditer(bare))
        if m := REFERENCE.match(bare):
            yield m.group(1)


def code_of(page: Path) -> list[str]:
    """The code of ``page``: lines of its code blocks and its inline code spans."""
    prose, code = split(page.read_text())
    return code + [m.group(2) for line in prose for m in INLINE_CODE.finditer(line)]


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    for target in ("docs/index.md", "docs/operating.md", "docs/contract.md"):
        assert target in set(links(README)), f"README.md does not link {target}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no heading with anchor #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_page_is_in_the_index() -> None:
    index = ROOT / "docs" / "index.md"
    listed = {(index.parent / t).resolve() for t in links(index) if not SCHEME.match(t)}
    missing = [p.name for p in PAGES[1:] if p != index and p not in listed]
    assert not missing, f"docs/index.md does not link {missing}"


def test_no_hand_kept_test_counts() -> None:
    for page in PAGES:
        found = re.findall(r"\b\d[\d,]* (?:tests|test cases)\b", page.read_text())
        assert not found, f"{page.relative_to(ROOT)} counts tests by hand: {found}"


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.MULTILINE)}


def test_every_make_target_named_exists() -> None:
    targets = makefile_targets()
    assert {"demo", "test"} <= targets
    named = {(page.name, m.group(1)) for page in PAGES for line in code_of(page) for m in MAKE.finditer(line)}
    assert ("README.md", "demo") in named and ("README.md", "test") in named
    unknown = sorted((p, t) for p, t in named if t not in targets)
    assert not unknown, f"make targets named but not in the Makefile: {unknown}"


def test_the_pre_commit_hooks_run_the_venvs_tools_and_download_nothing() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    assert {hook["language"] for hook in hooks} == {"system"}
    tools = {hook["entry"].split()[0] for hook in hooks}
    assert tools == {".venv/bin/ruff", ".venv/bin/mypy"}


def xmc_group() -> click.Group:
    """The top click group behind the ``xmc`` console script, wherever the CLI keeps it."""
    [ep] = [ep for ep in entry_points(group="console_scripts") if ep.name == "xmc"]
    loaded = ep.load()
    if isinstance(loaded, click.Group):
        return loaded
    module = importlib.import_module(ep.module)
    modules = [module]
    if hasattr(module, "__path__"):
        modules += [importlib.import_module(m.name) for m in pkgutil.walk_packages(module.__path__, f"{ep.module}.")]
    groups = {id(v): v for m in modules for v in vars(m).values() if isinstance(v, click.Group)}
    nested = {id(c) for g in groups.values() for c in g.commands.values()}
    [top] = [g for key, g in groups.items() if key not in nested]
    return top


def test_every_xmc_command_and_option_named_exists() -> None:
    group = xmc_group()
    options = {
        name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
        for name, cmd in group.commands.items()
    }
    assert {"pause", "enqueue", "status", "resume", "set", "stop", "list", "held", "dead", "demo"} <= set(options)
    unknown = []
    seen_in_readme = set()
    for page in PAGES:
        for line in code_of(page):
            for m in XMC.finditer(line):
                words = m.group(1).split()
                if not words or words[0].startswith("-"):
                    continue
                sub = re.match(r"[a-z][\w-]*", words[0])
                if sub is None:
                    continue  # a placeholder such as COMMAND
                name = sub.group(0)
                if page == README:
                    seen_in_readme.add(name)
                if name not in options:
                    unknown.append(f"{page.name}: xmc {name}")
                    continue
                for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", m.group(1)):
                    if flag not in options[name]:
                        unknown.append(f"{page.name}: xmc {name} {flag}")
    assert not unknown, f"commands or options named but not in the xmc CLI: {unknown}"
    assert {"pause", "enqueue", "resume"} <= seen_in_readme


def runnable(module: str) -> bool:
    """True when ``python -m module`` would run something: a package with ``__main__``, or a
    module with a ``__main__`` guard."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return spec.origin is not None and "__main__" in Path(spec.origin).read_text()


def test_every_python_module_named_runs() -> None:
    named = {(page.name, m.group(1)) for page in PAGES for line in code_of(page) for m in PYTHON_M.finditer(line)}
    assert {("README.md", "worker"), ("README.md", "xmc_resumption.worker")} <= named
    broken = sorted((p, mod) for p, mod in named if not runnable(mod))
    assert not broken, f"python -m modules named but not runnable: {broken}"


def code_files() -> Iterator[Path]:
    for name in CODE_FILES:
        yield ROOT / name
    for top in CODE_DIRS:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts:
                yield path


def test_every_citation_points_into_the_repository() -> None:
    broken = []
    for path in code_files():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        where = path.relative_to(ROOT)
        broken += [f"{where}: cites {m.group(0)!r}, outside the repository" for m in OUTSIDE.finditer(text)]
        for m in CITATION.finditer(text):
            page = ROOT / "docs" / m.group(1)
            if not page.exists():
                broken.append(f"{where}: cites docs/{m.group(1)}, which does not exist")
            elif m.group(2) and m.group(2) not in headings(page):
                broken.append(f"{where}: cites {m.group(2)!r}, not a heading of docs/{m.group(1)}")
    assert not broken, "; ".join(broken)


def test_the_anchor_rule_is_githubs() -> None:
    assert slug("Live control: Updates") == "live-control-updates"
    assert slug("Measured limits (figure g)") == "measured-limits-figure-g"
    assert slug("The `xmc` command") == "the-xmc-command"
    assert slug("Temporal: a cluster or Temporal Cloud") == "temporal-a-cluster-or-temporal-cloud"


def test_the_fleet_views_commands_in_operating_md_register_every_search_attribute() -> None:
    """docs/operating.md's ``search-attribute create`` lines and ``start-dev`` flags are the code's, whole."""
    from xmc_resumption import search_attributes

    text = (ROOT / "docs" / "operating.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("temporal operator search-attribute create")]
    assert lines == search_attributes.register_commands()
    start_dev = text[text.index("temporal server start-dev --search-attribute") :].split("\n```", 1)[0]
    assert start_dev.replace("\\\n", " ").split()[3:] == search_attributes.dev_server_args()
