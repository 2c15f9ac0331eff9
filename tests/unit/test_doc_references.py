"""The names the prose gives resolve (run by ``make lint``): every module, class, function or
setting a docstring, a comment, docs/*.md or the README names still exists under that name,
so a move or a rename that forgets its prose fails here rather than misleading a reader.

Two forms are checked:

- a full name, ``metalmend.api.power`` or ``metalmend_lab.lab``, anywhere in the text: a module,
  then attributes (a class's fields count, dataclass and pydantic);
- a short name, ``serve.app`` or ``policy.hostpower.decide``, that starts with the name of
  one of metalmend's packages or modules or of one it once had (``shipyard``, ``drydock``,
  ``etcd``: a stale name is the point of the check): it resolves when some module of
  metalmend ends with its first part (``policy.deploysite`` is
  ``metalmend.siteactions.policy.deploysite``) and the rest is found from there, or when it
  is a path in the settings tree (``serve.max_body_bytes``, ``settings.power.poll_budget``)
  or in the Helm chart's values (``serve.etcdCredentialsSecrets``).

What is not a name is left alone: domains (``metalmend.dev/...``, ``shipyard.metalmend.dev``),
file names (``serve.sqlite``, ``cli.py``), calls in examples (``log.info(...)``), short
names inside a longer code span (``asyncio.timeout(settings.timeout)``) or in a fenced
block of the docs (commands and YAML, where ``serve.`` is a chart value or a file).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import io
import re
import tokenize
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from metalmend.settings import Settings
from tests.unit import sources

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGES = ("metalmend", "metalmend_lab")
PYTHON = [
    *sorted((SRC / "metalmend").rglob("*.py")),
    *sorted((SRC / "metalmend_lab").rglob("*.py")),
    *sorted((ROOT / "tests").rglob("*.py")),
    *sorted((ROOT / "benchmarks").rglob("*.py")),
]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
VALUES = ROOT / "deploy" / "chart" / "values.yaml"

# Packages metalmend once had: a short name starting with one is stale unless it resolves.
FORMER = ("shipyard", "drydock", "deckhand", "promenade", "etcd", "design")
# A last part that makes a dotted word a file or a domain, not a name.
NOT_NAMES = frozenset(
    {"py", "md", "yaml", "yml", "json", "toml", "ini", "txt", "log", "crt", "key", "pem", "sqlite",
     "sh", "service", "conf", "dev", "io", "com", "org", "net"}
)  # fmt: skip

FULL = re.compile(r"(?<![\w./-])(metalmend(?:_lab)?(?:\.[A-Za-z_]\w*)+)")
SPAN = re.compile(r"(`+)(.+?)\1")


@cache
def modules() -> tuple[str, ...]:
    """Every module of metalmend and of the lab, by dotted name."""
    found = []
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            parts = path.relative_to(SRC).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return tuple(sorted(found))


def short_pattern() -> re.Pattern[str]:
    tops = {m.split(".")[1] for m in modules() if m.startswith("metalmend.")}
    tops.discard("__main__")
    firsts = "|".join(sorted(tops | set(FORMER)))
    return re.compile(rf"(?<![\w./@:-])((?:{firsts})(?:\.[A-Za-z_]\w*)+)")


SHORT = short_pattern()


def _load(module: str) -> ModuleType | None:
    if module.endswith("__main__"):  # runs the command line when imported
        return None
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        return None


def _has(obj: Any, attribute: str) -> Any:
    """``obj.attribute``, a dataclass's or a pydantic model's field (its type), or a
    sentinel when there is none."""
    if hasattr(obj, attribute):
        return getattr(obj, attribute)
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj):
            fields = {f.name: f for f in dataclasses.fields(obj)}
            if attribute in fields:
                return _field_type(obj, attribute)
        if attribute in getattr(obj, "model_fields", {}):
            return obj.model_fields[attribute].annotation
        for klass in obj.__mro__:
            if attribute in getattr(klass, "__annotations__", {}):
                return _field_type(klass, attribute)
    return _MISSING


_MISSING = object()


def _field_type(klass: type, attribute: str) -> Any:
    try:
        return typing.get_type_hints(klass)[attribute]
    except Exception:  # an annotation that does not evaluate still names a field
        return None


def _walk(obj: Any, rest: list[str], module: str | None) -> bool:
    for i, part in enumerate(rest):
        if module is not None and (SRC / Path(*module.split("."))).is_dir():
            child = f"{module}.{part}"
            if child in modules():
                obj, module = _load(child), child
                if obj is None:  # __main__
                    return i == len(rest) - 1
                continue
        obj, module = _has(obj, part), None
        if obj is _MISSING:
            return False
    return True


@cache
def full_name_resolves(name: str) -> bool:
    parts = name.split(".")
    root = _load(parts[0])
    return root is not None and _walk(root, parts[1:], parts[0])


@cache
def short_name_resolves(name: str) -> bool:
    first, *rest = name.split(".")
    for module in modules():
        if module.rsplit(".", 1)[-1] == first:
            loaded = _load(module)
            if loaded is not None and _walk(loaded, rest, module):
                return True
    setting = name.removeprefix("settings.").split(".")
    return _in_settings(Settings, setting) or _in_values(_values(), name.split("."))


def _in_settings(klass: Any, path: list[str]) -> bool:
    for part in path:
        if not (isinstance(klass, type) and dataclasses.is_dataclass(klass)):
            return False
        hints = typing.get_type_hints(klass)
        if part not in hints:
            return False
        klass = hints[part]
    return True


@cache
def _values() -> dict[str, Any]:
    return typing.cast(dict[str, Any], yaml.safe_load(VALUES.read_text()))


def _in_values(values: Any, path: list[str]) -> bool:
    for part in path:
        if not isinstance(values, dict) or part not in values:
            return False
        values = values[part]
    return True


@dataclasses.dataclass(frozen=True)
class Prose:
    path: Path
    line: int
    text: str


def prose_of_python(path: Path) -> Iterator[Prose]:
    """Comments and docstrings (module, class, function)."""
    source = path.read_text()
    lines = source.splitlines()
    # Tokenizing is the one exact way to tell a comment from a "#" in a string; only the
    # files with a "#" on a line that could name something need it.
    if any("#" in line and (FULL.search(line) or SHORT.search(line)) for line in lines):
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                yield Prose(path, token.start[0], token.string)
    for lineno, docstring in _docstrings(sources.parse(source, filename=str(path))):
        for offset, line in enumerate(docstring.splitlines()):
            yield Prose(path, lineno + offset, line)


def _docstrings(node: ast.AST) -> Iterator[tuple[int, str]]:
    """The docstrings of a module and of the classes and functions in it, walking statements
    only (expressions hold no docstring)."""
    body = getattr(node, "body", None)
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        first = body[0] if body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            yield first.lineno, first.value.value
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, None) or ():
            if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                yield from _docstrings(child)


def prose_of_markdown(path: Path) -> Iterator[Prose]:
    """Every line; fenced blocks marked by a leading NUL so short names there are skipped."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        yield Prose(path, number, ("\0" if fenced else "") + line)


@cache
def all_prose() -> tuple[Prose, ...]:
    return (
        *(prose for path in PYTHON for prose in prose_of_python(path)),
        *(prose for path in DOCS for prose in prose_of_markdown(path)),
    )


def _is_name(text: str, match: re.Match[str], full: bool) -> bool:
    """Not a file, a domain or (for a short name) a call in an example."""
    name = match.group(1)
    after = text[match.end() :]
    return not (
        name.rsplit(".", 1)[-1] in NOT_NAMES
        or after.startswith("/")
        or (not full and after.startswith("("))
    )


def _code_spans(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(2), m.end(2), m.group(2).strip()) for m in SPAN.finditer(text)]


def names_in(prose: Prose) -> Iterator[tuple[str, bool]]:
    """(name, full) for every name the line gives."""
    text = prose.text
    for match in FULL.finditer(text):
        if _is_name(text, match, full=True):
            yield match.group(1), True
    if text.startswith("\0"):
        return
    spans = _code_spans(text)
    for match in SHORT.finditer(text):
        inside = [s for s in spans if s[0] <= match.start() < s[1]]
        if inside and inside[0][2] != match.group(1):
            continue  # part of a longer code expression
        if _is_name(text, match, full=False):
            yield match.group(1), False


def unresolved() -> list[str]:
    wrong = []
    for prose in all_prose():
        for name, full in names_in(prose):
            ok = full_name_resolves(name) if full else short_name_resolves(name)
            if not ok:
                wrong.append(f"{prose.path.relative_to(ROOT)}:{prose.line}: {name}")
    return wrong


def test_the_check_sees_the_names() -> None:
    """Guards the check against passing vacuously: it finds names of both forms, and a
    stale one fails."""
    found = {name for prose in all_prose() for name, _ in names_in(prose)}
    assert {"metalmend.api", "policy.interlock", "serve.max_body_bytes"} <= found
    assert full_name_resolves("metalmend.db.leased.LeasedWorker")
    assert not full_name_resolves("metalmend.web.failures")
    assert not short_name_resolves("serve.leased")
    assert not short_name_resolves("shipyard.worker")
    assert short_name_resolves("policy.deploysite.read_site")
    assert short_name_resolves("settings.power.poll_budget")
    assert short_name_resolves("serve.etcdCredentialsSecrets")


@pytest.mark.parametrize(
    ("line", "names"),
    [
        ("(``serve.leased``, as Drydock's", ["serve.leased"]),
        ("# (shipyard.redeploy asks it again", ["shipyard.redeploy"]),
        ("``asyncio.timeout(settings.timeout)``", []),
        ('``log.info("x")`` prints', []),
        ("labels ``metalmend.dev/etcd-credentials``", []),
        ("`sqlite3 serve.sqlite .backup`", []),
        ("shipyard.metalmend.dev's actions", []),
        ("``metalmend.web.status.problem(...)``", ["metalmend.web.status.problem"]),
    ],
)
def test_what_counts_as_a_name(line: str, names: list[str]) -> None:
    assert [n for n, _ in names_in(Prose(Path("x"), 1, line))] == names


def test_every_name_in_the_prose_resolves() -> None:
    wrong = unresolved()
    assert not wrong, (
        "these name a module, class, function or setting that does not exist (moved or"
        " renamed? say where it is now):\n" + "\n".join(wrong)
    )
