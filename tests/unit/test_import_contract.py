"""The package's import contract, read from the source with ``ast`` (run by ``make lint``):

- ``metalmend.policy`` and each service component's ``policy`` package decide without I/O:
  they import only the standard library, the shared vocabulary in ``metalmend.api`` (the
  power vocabulary included), and the policy packages;
- the lab and the demos (real control plane, emulated BMCs, kubelet simulators) are a
  harness of their own, the package ``metalmend_lab`` (the distribution metalmend-lab,
  lab/pyproject.toml, never in metalmend's wheel or image): nothing in ``metalmend``
  imports it, not even lazily; its verbs reach the ``metalmend`` command through an
  entry point, and without it they say in one line how to get it;
- the lab's verbs load the lab only inside their commands, so that ``metalmend --help``
  does not load it (nor sushy-tools);
- every third-party module the packages import comes from a distribution they declare
  (``[project].dependencies``; the lab also from its own, lab/pyproject.toml);
- no test reaches into a controller's private names;
- the layers (docs/architecture.md): the CLI above the applications (``metalmend serve``,
  ``metalmend run``), the controllers, the settings tree, the service components, the
  web layer / kube / bmc / db, the policy, the shared vocabulary; an import runs only
  downwards (or within its own package);
- the service components (teardown, designs, destroy, siteactions) import each other only
  through their named interfaces, in one direction, and no domain module of theirs imports
  the HTTP layer;
- no cycle between packages, nor between modules at import time.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit import sources

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "metalmend"
LAB = SRC / "metalmend_lab"
LAB_MODULES = ("metalmend_lab",)
LAB_PROJECT = SRC.parent / "lab" / "pyproject.toml"

# The pure decisions: the controllers' (metalmend.policy) and each service component's.
POLICY_PACKAGES = (
    "metalmend.policy",
    "metalmend.teardown.policy",
    "metalmend.destroy.policy",
    "metalmend.siteactions.policy",
)
# What policy modules may import besides the standard library (a module or its children).
POLICY_MAY_IMPORT = ("metalmend.api", *POLICY_PACKAGES)
# Imports that break the policy rule but cannot be moved yet, as (module, imported):
# each with the reason and what removes it. Empty: the policy follows the rule.
POLICY_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()

# Top-level modules of the lab's own dependencies (lab/pyproject.toml).
LAB_DEPENDENCIES = ("sushy_tools", "sushy", "bcrypt")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    imported: str  # absolute name of what it imports
    line: int
    top_level: bool  # runs when the module is imported (not inside a function)
    type_checking: bool  # under ``if TYPE_CHECKING:``, never run


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(path: Path) -> Iterator[Import]:
    module = module_name(path)
    is_package = path.name == "__init__.py"
    tree = sources.parse(path.read_text(), filename=str(path))

    def visit(node: ast.AST, top_level: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, alias.name, child.lineno, top_level, type_checking)
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(child, module, is_package)
                for alias in child.names:
                    # `from metalmend_lab import lab` imports metalmend_lab.lab; a name that
                    # is not a module still means its package, which the prefix check sees.
                    name = f"{base}.{alias.name}" if alias.name != "*" else base
                    yield Import(module, name, child.lineno, top_level, type_checking)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from visit(child, False, type_checking)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), top_level, True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), top_level, False)
            else:
                yield from visit(child, top_level, type_checking)

    yield from visit(tree, True, False)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def all_imports() -> list[Import]:
    """Every import of metalmend and of the lab (metalmend_lab)."""
    paths = sorted([*PACKAGE.rglob("*.py"), *LAB.rglob("*.py")])
    return [i for path in paths for i in imports_of(path)]


def show(found: list[Import]) -> str:
    return "\n".join(f"{i.module}:{i.line} imports {i.imported}" for i in found)


def test_the_contract_sees_the_package() -> None:
    """Guards the checks below against passing vacuously (a moved tree, a broken walk)."""
    found = all_imports()
    assert any(i.module == "metalmend.policy.remediation" for i in found)
    assert any(i.module == "metalmend.cli.main" for i in found)
    assert any(
        i.module == "metalmend_lab.cli" and i.imported.startswith("metalmend_lab.lab")
        for i in found
    )


def test_policy_imports_only_the_standard_library_and_the_shared_vocabulary() -> None:
    stdlib = sys.stdlib_module_names
    wrong = [
        i
        for i in all_imports()
        if within(i.module, POLICY_PACKAGES)
        and i.imported.partition(".")[0] not in stdlib
        and not within(i.imported, POLICY_MAY_IMPORT)
        and (i.module, i.imported) not in POLICY_EXCEPTIONS
    ]
    assert not wrong, "policy must decide without I/O:\n" + show(wrong)


def test_nothing_in_metalmend_imports_the_lab() -> None:
    """Not even lazily: the production wheel and image do not carry metalmend_lab."""
    wrong = [
        i
        for i in all_imports()
        if within(i.module, ("metalmend",)) and within(i.imported, ("metalmend_lab",))
    ]
    assert not wrong, "the lab is a harness, not part of metalmend:\n" + show(wrong)


def test_the_lab_verbs_load_the_lab_only_in_the_commands_that_use_it() -> None:
    """metalmend_lab.cli is loaded at every start of ``metalmend`` (its entry point)."""
    eager = [
        i
        for i in all_imports()
        if i.module == "metalmend_lab.cli"
        and i.top_level
        and not i.type_checking
        and (
            (within(i.imported, ("metalmend_lab",)) and i.imported != "metalmend_lab.cli")
            or i.imported.partition(".")[0] in LAB_DEPENDENCIES
        )
    ]
    assert not eager, "import these inside the lab commands:\n" + show(eager)


def test_importing_the_policy_loads_no_io_library() -> None:
    program = (
        "import sys, pkgutil, importlib\n"
        f"for name in {POLICY_PACKAGES!r}:\n"
        "    p = importlib.import_module(name)\n"
        "    for m in pkgutil.iter_modules(p.__path__): importlib.import_module(f'{name}.{m.name}')\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = result.stdout.split()
    io = (
        "httpx",
        "httpx2",
        "pycurl",
        "pyghmi",
        "lightkube",
        "metalmend.bmc.pool",
        "metalmend.kube",
    )
    assert not [m for m in loaded if within(m, io)]


def without_the_lab(*command: str) -> subprocess.CompletedProcess[str]:
    """``metalmend COMMAND`` as where only metalmend is installed: importing the lab or its
    dependencies fails (its entry point's metadata may be left behind)."""
    program = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class NoLab(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("metalmend_lab", *{LAB_DEPENDENCIES!r}):
                    raise ModuleNotFoundError(f"{{name}} is not installed here", name=name)
                return None

        sys.meta_path.insert(0, NoLab())
        sys.argv = ["metalmend", *{list(command)!r}]
        from metalmend.cli.main import main
        main()
        """
    )
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("command", [["--help"], ["run", "--help"], ["version"]])
def test_the_cli_works_without_the_lab(command: list[str]) -> None:
    result = without_the_lab(*command)
    assert result.returncode == 0, result.stderr
    assert result.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["lab", "up"],
        ["lab", "status", "--dir", "x"],
        ["lab", "--help"],
        ["demo"],
        ["demo-site", "--keep"],
    ],
)
def test_the_lab_verbs_without_the_lab_say_how_to_get_it_in_one_line(command: list[str]) -> None:
    result = without_the_lab(*command)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "metalmend: the lab and the demos come with metalmend-lab, which is not installed"
        " here: in a checkout of metalmend, run 'pip install ./lab' (make venv does)"
    ]


def test_lab_up_offers_the_labs_own_default_controllers() -> None:
    from metalmend_lab import cli, lab

    assert cli.LAB_CONTROLLERS == lab.DEFAULT_CONTROLLERS
    assert cli.LAB_BMO_CONTROLLERS == lab.BMO_CONTROLLERS
    assert cli.LAB_MACHINE_APIS == lab.MACHINE_APIS


def test_lab_up_offers_the_provisioners_own_default_delay() -> None:
    from metalmend_lab import cli, provisioner

    assert cli.LAB_PROVISION_DELAY == provisioner.DEFAULT_DELAY


def test_the_lab_is_the_version_of_metalmend_it_was_made_with() -> None:
    """The lab uses metalmend's internals: it pins the version of its own checkout."""
    core = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]
    lab = tomllib.loads(LAB_PROJECT.read_text())["project"]
    assert lab["version"] == core["version"]
    assert f"metalmend=={core['version']}" in lab["dependencies"]


def _distribution(requirement: str) -> str:
    """The normalized distribution name of a requirement ("PyYAML>=6" -> "pyyaml")."""
    name = re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_a_declared_dependency() -> None:
    """What the packages import must be installed by installing them: metalmend's from
    its ``[project].dependencies``, the lab's also from its own (lab/pyproject.toml).
    (A module that arrives only as someone else's dependency can vanish with their
    next release.)"""
    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]
    core = {_distribution(r) for r in project["dependencies"]}
    lab = core | {
        _distribution(r) for r in tomllib.loads(LAB_PROJECT.read_text())["project"]["dependencies"]
    }
    providers = importlib.metadata.packages_distributions()
    stdlib = sys.stdlib_module_names
    wrong = []
    for i in all_imports():
        top = i.imported.partition(".")[0]
        if top in stdlib or top in ("metalmend", "metalmend_lab") or i.type_checking:
            continue
        declared = lab if within(i.module, ("metalmend_lab",)) else core
        offered = {_distribution(d) for d in providers.get(top, [])}
        if not offered & declared:
            wrong.append(f"{i.module}:{i.line} imports {top} (from {sorted(offered) or '?'})")
    assert not wrong, "declare these in pyproject.toml:\n" + "\n".join(wrong)


def _reads_status_code(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "code"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "status"
    )


def test_only_kube_errors_compares_api_status_codes() -> None:
    """Call sites ask what a refusal means (``errors.is_not_found(error)``); the numbers
    live in metalmend.kube.errors alone."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if module_name(path) == "metalmend.kube.errors":
            continue
        for node in ast.walk(sources.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Compare) and any(
                _reads_status_code(part) for part in [node.left, *node.comparators]
            ):
                wrong.append(f"{module_name(path)}:{node.lineno}")
    assert not wrong, "use metalmend.kube.errors:\n" + "\n".join(wrong)


TESTS = PACKAGE.parents[1] / "tests"


def _private_uses(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """``from metalmend.controllers... import _x`` and ``<controller module>._x``."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "metalmend.controllers"
        ):
            for alias in node.names:
                if alias.name.startswith("_"):
                    yield node.lineno, f"{node.module}.{alias.name}"
                aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("metalmend.controllers"):
                    aliases.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            yield node.lineno, f"{node.value.id}.{node.attr}"


def test_no_test_reaches_into_a_controllers_private_names() -> None:
    """Tests drive controllers through what they offer (observe, decide, act, the Writer:
    docs/decide-act.md), so that a change inside a controller is seen by the tests that
    prove it safe instead of being copied around them."""
    wrong = [
        f"{path.relative_to(TESTS.parent)}:{line} uses {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in _private_uses(sources.parse(path.read_text(), filename=str(path)))
    ]
    assert not wrong, "\n".join(wrong)


# ---- layers -----------------------------------------------------------------------------

# From the top down; an import may go to its own layer's package or to any layer below.
# Packages in one layer do not import each other unless a rule below allows it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("metalmend.cli", "metalmend.__main__"),
    ("metalmend.serve", "metalmend.runner"),  # the applications: serve, run
    ("metalmend.controllers",),  # run's controllers
    ("metalmend.settings",),  # the settings tree: every section
    ("metalmend.siteactions",),  # the service components, one above the other ...
    ("metalmend.destroy",),
    ("metalmend.teardown",),
    ("metalmend.designs",),  # ... (COMPONENT_INTERFACES: through which modules)
    ("metalmend.web",),  # what the components' routers share
    ("metalmend.kube", "metalmend.bmc", "metalmend.db"),
    ("metalmend.policy",),  # the controllers' pure decisions
    ("metalmend.api", "metalmend.errors", "metalmend.yamlsafe", "metalmend.clock",
     "metalmend.log", "metalmend.heap", "metalmend"),
)  # fmt: skip

# The CLI's modules and the base modules use each other freely.
SIDEWAYS_LAYERS = (0, len(LAYERS) - 1)
# Within the layer of kube, bmc and db, these go one way (and no other pair at all).
SIDEWAYS = {("metalmend.bmc", "metalmend.kube"), ("metalmend.db", "metalmend.kube")}

COMPONENTS = (
    "metalmend.teardown",
    "metalmend.designs",
    "metalmend.destroy",
    "metalmend.siteactions",
)
# What a component offers the others; a component imports another through these alone
# (never its routes, worker, tables or store internals not named here).
COMPONENT_INTERFACES = {
    # The teardown claim (invariant 7), and the steps redeploy_server runs in-process.
    "metalmend.teardown": (
        "metalmend.teardown.interlock", "metalmend.teardown.drain", "metalmend.teardown.removal",
        "metalmend.teardown.shutdown",
        "metalmend.teardown.decommission", "metalmend.teardown.params",
        "metalmend.teardown.etcd.access", "metalmend.teardown.etcd.design",
        "metalmend.teardown.etcd.members", "metalmend.teardown.policy",
    ),
    # A destroy task as redeploy_server creates and watches one.
    "metalmend.destroy": (
        "metalmend.destroy.model", "metalmend.destroy.store", "metalmend.destroy.policy",
    ),
    # The design store: its documents, rules, references and how a router reads it.
    "metalmend.designs": (
        "metalmend.designs.access", "metalmend.designs.store", "metalmend.designs.documents",
        "metalmend.designs.rules", "metalmend.designs.designref",
    ),
    "metalmend.siteactions": (),
}  # fmt: skip

# The modules of a component that speak HTTP (its routers and their helpers); the rest of
# the component is domain code and raises metalmend.errors, never a Status.
HTTP_MODULES = (
    "metalmend.teardown.routes", "metalmend.teardown.etcd.routes",
    "metalmend.teardown.http",
    "metalmend.designs.routes", "metalmend.designs.access",
    "metalmend.destroy.routes", "metalmend.siteactions.routes",
)  # fmt: skip
HTTP_LAYER = ("metalmend.web", "metalmend.serve", "fastapi", "starlette")
# What the web layer offers domain code: the RBAC vocabulary lives in kube.rbac, the
# error vocabulary in metalmend.errors; nothing of web is domain vocabulary.


def layer_of(module: str) -> tuple[int, str] | None:
    """The layer of ``module`` and the package it belongs to there (the longest match)."""
    best: tuple[int, str] | None = None
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and (
                best is None or len(package) > len(best[1])
            ):
                best = (rank, package)
    return best


def _package_imports() -> list[Import]:
    return [i for i in all_imports() if within(i.imported, ("metalmend",)) and not i.type_checking]


def test_every_module_has_a_layer() -> None:
    """A new top-level package or module is placed in LAYERS (and docs/architecture.md)."""
    homeless = sorted(
        {
            module_name(path)
            for path in PACKAGE.rglob("*.py")
            if not within(module_name(path), LAB_MODULES)
            and (layer_of(module_name(path)) or (0, "metalmend"))[1] == "metalmend"
            and module_name(path) != "metalmend"
        }
    )
    assert not homeless, "give these a layer:\n" + "\n".join(homeless)


def test_imports_run_down_the_layers() -> None:
    wrong = []
    for i in _package_imports():
        if within(i.module, LAB_MODULES) or within(i.imported, LAB_MODULES):
            continue  # the harness: test_nothing_in_metalmend_imports_the_lab
        here, there = layer_of(i.module), layer_of(i.imported)
        assert here is not None, i
        assert there is not None, i
        if there[0] < here[0] or (
            there[0] == here[0]
            and there[1] != here[1]
            and here[0] not in SIDEWAYS_LAYERS
            and (here[1], there[1]) not in SIDEWAYS
        ):
            wrong.append(i)
    assert not wrong, "an import against the layers:\n" + show(wrong)


def test_components_meet_only_through_their_interfaces() -> None:
    wrong = []
    for i in _package_imports():
        mine = next((c for c in COMPONENTS if within(i.module, (c,))), None)
        theirs = next((c for c in COMPONENTS if within(i.imported, (c,))), None)
        if (
            mine
            and theirs
            and mine != theirs
            and not within(i.imported, COMPONENT_INTERFACES[theirs])
        ):
            wrong.append(i)
    assert not wrong, "through the other component's interface:\n" + show(wrong)


def test_domain_code_does_not_speak_http() -> None:
    """The components' domain modules raise metalmend.errors; only their routers (and the
    web layer, the application) build Status answers."""
    wrong = [
        i
        for i in all_imports()
        if within(i.module, COMPONENTS)
        and not within(i.module, HTTP_MODULES)
        and within(i.imported, HTTP_LAYER)
    ]
    assert not wrong, "raise metalmend.errors instead:\n" + show(wrong)


def test_importing_the_domain_code_loads_no_http_layer() -> None:
    """What the imports above cannot see, in a process of its own: loading every domain
    module of the components (the site actions' steps, the teardown step machines they
    run in-process) loads neither FastAPI nor a router, not even through another module."""
    program = (
        "import sys, pkgutil, importlib\n"
        f"for name in {COMPONENTS!r}:\n"
        "    p = importlib.import_module(name)\n"
        "    for m in pkgutil.walk_packages(p.__path__, name + '.'):\n"
        f"        if m.name not in {HTTP_MODULES!r}: importlib.import_module(m.name)\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = [m for m in result.stdout.split() if within(m, (*HTTP_LAYER, *HTTP_MODULES))]
    assert not loaded, "loaded by domain code:\n" + "\n".join(loaded)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_cycle_between_packages() -> None:
    """Between the packages under metalmend (and its top-level modules), counting every
    import, lazy ones too: a lazy import hides a cycle, it does not remove it."""
    edges: dict[str, set[str]] = {}
    for i in _package_imports():
        a, b = ".".join(i.module.split(".")[:2]), ".".join(i.imported.split(".")[:2])
        if a != b:
            edges.setdefault(a, set()).add(b)
    assert not _cycles(edges)


def test_no_cycle_between_modules_at_import_time() -> None:
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for i in _package_imports():
        if not i.top_level:
            continue
        target = i.imported if i.imported in modules else i.imported.rpartition(".")[0]
        if target in modules and target != i.module and not i.module.startswith(target + "."):
            edges.setdefault(i.module, set()).add(target)
    assert not _cycles(edges)
