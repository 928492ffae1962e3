"""The architecture, enforced: imports follow the layers, no import cycles, small modules and functions.

The layers, lowest first (docs/concepts/architecture.md, which holds the picture and table that
:func:`layers_block` draws from ``LAYERS``); a module may import its own layer and those below:

    core → data → retrievers → generators → env → eval → rewards → train → policies
    → runner / reporting → commands

Every import counts: at the top of a module, inside a function (a lazy import) and under
``TYPE_CHECKING``. The graph is :func:`rag_lab.core.cache.import_graph` (the one the cache keys' code digests
read), where importing ``a.b.c`` also runs the packages ``a`` and ``a.b``.
"""

import ast
import textwrap

import pytest

from rag_lab.core.cache import PACKAGE_DIR, import_graph, module_files

LAYERS = [
    ("core", ["rag_lab", "rag_lab.core"]),
    ("data", ["rag_lab.data"]),
    ("retrievers", ["rag_lab.retrievers"]),
    ("generators", ["rag_lab.generators"]),
    ("env", ["rag_lab.env"]),
    ("eval", ["rag_lab.eval"]),
    ("rewards", ["rag_lab.rewards"]),
    ("train", ["rag_lab.train", "rag_lab.checkpoints"]),
    ("policies", ["rag_lab.policies"]),
    ("runner / reporting", ["rag_lab.runner", "rag_lab.reporting", "rag_lab.loggers"]),
    (
        "commands",
        [
            "rag_lab.__main__",
            "rag_lab.run",
            "rag_lab.report",
            "rag_lab.claims",
            "rag_lab.score",
            "rag_lab.serve",
            "rag_lab.index",
            "rag_lab.plan",
            "rag_lab.quickstart",
            # the two training commands inside train/ (`make tiny-lm`, `python -m rag_lab.train.cold_start`)
            "rag_lab.train.tiny.ship",
            "rag_lab.train.cold_start.__main__",
        ],
    ),
]
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80


def layer_of(module: str) -> int:
    """The index of ``module``'s layer: its longest listed prefix."""
    best = None
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > best[1]):
                best = (i, len(name))
    if best is None:
        raise AssertionError(
            f"{module} is in no layer: add it to LAYERS (tests/test_layers.py) and to "
            "docs/concepts/architecture.md"
        )
    return best[0]


def upward_imports(graph: dict[str, frozenset[str]]) -> list[str]:
    return sorted(
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in graph.items()
        for t in targets
        if layer_of(t) > layer_of(m)
    )


def cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_import_goes_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checks_see_an_upward_import_and_a_cycle():
    # a training recipe that imports a policy, and two modules that import each other
    graph = {
        "rag_lab.train.x": frozenset({"rag_lab.policies.y"}),
        "rag_lab.policies.y": frozenset(),
        "rag_lab.env.a": frozenset({"rag_lab.env.b"}),
        "rag_lab.env.b": frozenset({"rag_lab.env.a"}),
    }
    assert upward_imports(graph) == ["rag_lab.train.x (train) imports rag_lab.policies.y (policies)"]
    assert cycles(graph) == [["rag_lab.env.a", "rag_lab.env.b"]]


def test_the_graph_sees_lazy_and_type_checking_imports():
    graph = import_graph()
    # rag_lab.run imports policies nowhere; the cold start imports the teacher lazily and under TYPE_CHECKING
    assert "rag_lab.env.teacher.generator" in graph["rag_lab.train.demonstrations"]
    assert all(m in graph for m in module_files())


ARCHITECTURE_PAGE = PACKAGE_DIR.parent / "docs" / "concepts" / "architecture.md"


def short(module: str) -> str:
    return module.removeprefix("rag_lab.")


def layers_block() -> str:
    """The architecture page's picture of ``LAYERS`` (highest first) and its table of what each may import."""
    width = max(len(name) for name, _ in LAYERS) + 2
    rows = []
    for name, modules in reversed(LAYERS):
        lines = textwrap.wrap(" · ".join(map(short, modules)), 100 - width, break_on_hyphens=False)
        rows.append("\n".join(f"{name if i == 0 else '':<{width}}{line}" for i, line in enumerate(lines)))
    picture = f"\n{'':<4}│ imports ↓\n".join(rows)
    table = ["| layer | modules | may import |", "|---|---|---|"]
    for i, (name, modules) in enumerate(LAYERS):
        below = ", ".join(n for n, _ in reversed(LAYERS[:i])) or "nothing else"
        table.append(f"| {name} | {', '.join(f'`{short(m)}`' for m in modules)} | its own layer; {below} |")
    return f"```text\n{picture}\n```\n\n" + "\n".join(table)


def test_the_architecture_page_shows_these_layers():
    block = layers_block()
    assert block in ARCHITECTURE_PAGE.read_text(), f"{ARCHITECTURE_PAGE}: put this block there:\n\n{block}"


@pytest.mark.parametrize("module", sorted(module_files()))
def test_modules_and_functions_stay_small(module):
    file = module_files()[module]
    lines = file.read_text().splitlines()
    assert len(lines) <= MAX_FILE_LINES, f"{file.relative_to(PACKAGE_DIR.parent)}: {len(lines)} lines"
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{module}.{node.name}: {length} lines"


# rag_lab/'s top level (issue 67): the commands only (__init__ counted); the rest in a package of its layer.
# __main__ (``rag-lab``, every command's front door) is the package's own, as __init__ is, and not counted.
# Issue 73 added the ninth: quickstart (``make quickstart``, the README's first command).
MAX_TOP_LEVEL = 9


def test_the_top_level_holds_the_commands_only():
    top = sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) + 1 <= MAX_TOP_LEVEL, f"rag_lab/ holds {len(top) + 1} modules: {top}"
    for name in top:
        assert layer_of(f"rag_lab.{name}") == len(LAYERS) - 1, f"rag_lab.{name}: not in the commands' layer"
        source = (PACKAGE_DIR / f"{name}.py").read_text()
        assert 'if __name__ == "__main__":' in source, f"rag_lab.{name}: no ``python -m rag_lab.{name}``"


def test_every_command_is_an_entry_point():
    """A module in the commands' layer is run, never imported by the package: ``python -m`` runs it."""
    files, graph = module_files(), import_graph()
    for module in LAYERS[-1][1]:
        source = files[module].read_text()
        assert module.endswith(".__main__") or 'if __name__ == "__main__":' in source, module
        assert not [m for m, targets in graph.items() if module in targets], f"{module} is imported"
