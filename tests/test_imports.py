"""The package's import graph has no cycle: stages import only what lies below them.

The graph is built statically (ast) from every ``import`` in ``src/taurl``, at module level
and inside functions and methods alike (a package's ``__getattr__`` or a ``__call__``): a
function-level import is still a dependency, it only runs later (a lazy import hides a
cycle, it does not remove it); ``importlib.import_module("taurl.x")`` with a literal name
counts as an import too. Imports under ``if TYPE_CHECKING:`` are left out: they never run
and exist for annotations only.

An edge goes to the most specific module named (``from taurl.a import b`` is an edge to
``taurl.a.b`` when that is a module, else to ``taurl.a``) and to the packages the import runs
on the way: importing ``taurl.a.b`` runs ``taurl/a/__init__.py`` first, so ``from taurl.a
import b`` also depends on ``taurl.a`` (a package whose ``__init__`` reaches up, even lazily,
closes a cycle through every module that imports from it). Two packages are no edges: the
importer's own (a package being initialised when its submodule runs is how packages work),
and the root ``taurl``, whose ``__init__`` re-exports the public API lazily (PEP 562) and
imports nothing when loaded (test_api checks that ``import taurl`` stays cheap).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def _ancestors(dotted: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages importing it runs first."""
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _literal_import_module(node: ast.AST) -> str | None:
    """The name in ``importlib.import_module("x")`` / ``import_module("x")``, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    arg = node.args[0]
    if called == "import_module" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def _imported(name: str, path: Path, tree: ast.AST, modules: dict[str, Path],
              typing: bool = False) -> set[str]:
    """The package modules that module `name` (at `path`) imports, and the packages those
    imports run (module docstring); with `typing`, its TYPE_CHECKING imports too."""
    skip = set() if typing else _type_checking_nodes(tree)
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def target(dotted: str) -> str | None:
        while dotted and dotted not in modules:  # taurl.a.func -> taurl.a
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                found.add(target(a.name) or "")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                found.add(target(f"{base}.{a.name}") or target(base) or "")
        elif (literal := _literal_import_module(node)) is not None:
            found.add(target(literal) or "")
    found.discard("")
    own = set(_ancestors(name)) | ({name} if is_pkg else set())
    root = name.split(".")[0]
    found |= {p for m in found for p in _ancestors(m)
              if p in modules and p not in own and p != root}
    found.discard(name)
    return found


def import_graph(root: Path, package: str, typing: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (anywhere in its body; with `typing`,
    for its annotations too)."""
    modules = _modules(root, package)
    return {name: _imported(name, path, ast.parse(path.read_text(), str(path)), modules, typing)
            for name, path in modules.items()}


# Edges against the loop's direction (issue 38): (importer, imported, why it must not),
# each a module or package prefix; an annotation-only import counts (a type names its home).
AGAINST_THE_LOOP = [
    ("taurl.rollout", "taurl.proxy", "the proxy is a collector the caller passes in "
                                     "(LocalCollector.run); the rollout stage never imports it"),
    ("taurl.rollout.compaction", "taurl.rollout.loop", "compaction reads the episode through "
                                                       "its own CompactionState protocol"),
    ("taurl.envs", "taurl.train", "an env names what to train; the recipe passes the trainer "
                                  "in (the warm-up hook's copy_phase)"),
]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def edges_against(graph: dict[str, set[str]], rules=AGAINST_THE_LOOP) -> list[str]:
    """Every import of `graph` that a rule forbids, as ``importer -> imported``."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  for low, high, _ in rules if _under(a, low) and _under(b, high))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_taurl_has_no_import_cycle():
    # The ~300 parses run in a child process of their own: CPython 3.11 counts AST-construction
    # depth per interpreter, not per thread (python/cpython#106905), so a parse beside another
    # thread's parse can fail with "AST constructor recursion depth mismatch", and a test worker
    # may hold threads that earlier tests started (seen once in a fresh-clone `make test`).
    child = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    found = json.loads(child.stdout)["cycles"]
    assert not found, "import cycles (each line one strongly connected component):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.mark.parametrize("how", ["module level", "in a function", "relative"])
def test_a_cycle_is_found(tmp_path, how):
    back = {"module level": "from pkg.a import f\n",
            "in a function": "def g():\n    from pkg.a import f\n    return f\n",
            "relative": "from . import a\n"}[how]
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.sub.b import g\ndef f(): ...\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": back.replace(". import", ".. import"),
            "pkg/c.py": "import pkg.a\n",
        },
    )
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.sub.b"]]


@pytest.mark.parametrize("how", ["from package import submodule", "import package.submodule as m",
                                 "import_module literal"])
def test_a_cycle_through_a_package_init_that_reaches_up_is_found(tmp_path, how):
    """What the check once missed: a package whose ``__init__`` imports the top lazily (in a
    ``__call__``: the package made callable), and a top module that imports only a
    submodule of it; importing the submodule runs the package's ``__init__`` first."""
    up = {"from package import submodule": "from pkg.sub import b\n",
          "import package.submodule as m": "import pkg.sub.b as b\n",
          "import_module literal": "import importlib\nb = importlib.import_module('pkg.sub.b')\n"}
    init = ("import types\nclass P(types.ModuleType):\n    def __call__(self):\n"
            "        from pkg.top import run\n        return run()\n")
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/top.py": up[how] + "def run(): ...\n",
                      "pkg/sub/__init__.py": init,
                      "pkg/sub/b.py": "from pkg.sub import c\n", "pkg/sub/c.py": ""})
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.top"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.sub.c"}  # its own package is no edge
    assert cycles(graph) == [["pkg.sub", "pkg.top"]]


def test_no_cycle_without_the_back_edge(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg.sub.b import g\n",
                      "pkg/sub/__init__.py": "", "pkg/sub/b.py": "import json\n",
                      "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from pkg.a import f\n",
                      "pkg/d.py": "import pkg.c\n"})
    # a TYPE_CHECKING import is no edge: c -> a is left out, so a, b, c, d form no cycle
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"} and graph["pkg.c"] == set()
    assert cycles(graph) == []


# The layers a lower one must not import (issue 38): the math and the data formats (data/,
# credit/, train/objectives/, policy/) serve every recipe, CLI, proxy and env, so none of them
# may depend on one. The envs package's own protocol modules are not "a specific env".
LOWER = ("data", "credit", "train.objectives", "policy")
UPPER = ("recipe", "cli", "api", "proxy")
ENV_PROTOCOL = {"envs", "envs.core", "envs.spec", "envs.registry", "envs.tasks", "envs.checker"}


def upward_edges(graph: dict[str, set[str]], package: str = "taurl") -> list[tuple[str, str]]:
    """(importer, imported) pairs where a LOWER layer reaches an UPPER one or a specific env."""
    def within(module: str, layers: tuple[str, ...]) -> bool:
        return any(module == f"{package}.{x}" or module.startswith(f"{package}.{x}.")
                   for x in layers)

    def specific_env(module: str) -> bool:
        return within(module, ("envs",)) and module.removeprefix(f"{package}.") not in ENV_PROTOCOL

    return sorted((a, b) for a, targets in graph.items() if within(a, LOWER)
                  for b in targets if within(b, UPPER) or specific_env(b))


def test_lower_layers_import_no_recipe_cli_api_proxy_or_env():
    assert upward_edges(import_graph(SRC, "taurl")) == []


@pytest.mark.parametrize("target", ["pkg.recipe.loop", "pkg.envs.search.env", "pkg.api"])
def test_an_upward_edge_is_found_even_inside_a_function(tmp_path, target):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/credit/__init__.py": "",
                      "pkg/credit/grpo.py": f"def f():\n    import {target}\n",
                      "pkg/recipe/__init__.py": "", "pkg/recipe/loop.py": "",
                      "pkg/envs/__init__.py": "", "pkg/envs/core.py": "",
                      "pkg/envs/search/__init__.py": "", "pkg/envs/search/env.py": "",
                      "pkg/api.py": "", "pkg/data.py": "import pkg.envs.core\n"})
    edges = upward_edges(import_graph(tmp_path, "pkg"), "pkg")
    assert ("pkg.credit.grpo", target) in edges  # (and the packages the import runs on the way)
    assert {a for a, _ in edges} == {"pkg.credit.grpo"}  # pkg.data -> envs.core is allowed


def test_no_module_is_over_450_lines():
    # the house rule (docs/design.md#layout): a module a reader can hold, one job each
    src = Path(__file__).parents[1] / "src" / "taurl"
    long = {str(p.relative_to(src)): n for p in src.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}, f"split these modules: {long}"


def test_no_module_re_exports_names_from_their_old_home():
    # issue 38: a name lives in one module and is imported from there; a re-export kept for an
    # old import path (an unused-import waiver on a `from taurl...` line) hides the code; a
    # documented public alias says "public" in its comment (`taurl.envs.core.Task`)
    src = Path(__file__).parents[1] / "src" / "taurl"
    found = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if line.startswith("from taurl") and "noqa: F401" in line and "public" not in line]
    assert found == [], f"import these names from their home instead: {found}"



def test_no_edge_against_the_loops_direction():
    child = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    found = json.loads(child.stdout)["against"]
    assert not found, "edges against the loop's direction:\n" + "\n".join(found)


def test_an_edge_against_the_loop_is_found(tmp_path):
    """Each rule catches its edge, a function-level or annotation-only import included."""
    _write(tmp_path, {"taurl/__init__.py": "", "taurl/rollout/__init__.py": "",
                      "taurl/proxy/__init__.py": "", "taurl/proxy/collect.py": "",
                      "taurl/envs/__init__.py": "", "taurl/train/__init__.py": "",
                      "taurl/train/copy_warmup.py": "", "taurl/rollout/loop.py": "",
                      "taurl/rollout/episodes.py":
                          "def f():\n    from taurl.proxy import collect\n",
                      "taurl/rollout/compaction.py": "from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from taurl.rollout.loop import _State\n",
                      "taurl/envs/hooks.py":
                          "def w():\n    from taurl.train.copy_warmup import f\n"})
    assert edges_against(import_graph(tmp_path, "taurl", typing=True)) == [
        "taurl.envs.hooks -> taurl.train", "taurl.envs.hooks -> taurl.train.copy_warmup",
        "taurl.rollout.compaction -> taurl.rollout.loop",
        "taurl.rollout.episodes -> taurl.proxy", "taurl.rollout.episodes -> taurl.proxy.collect"]


if __name__ == "__main__":  # the graph tests' child: the cycles and forbidden edges as JSON
    print(json.dumps({"cycles": cycles(import_graph(SRC, "taurl")),
                      "against": edges_against(import_graph(SRC, "taurl", typing=True))}))
