"""trtq's import graph (imports inside functions included) has no cycle: a module may not import,
directly or through others, a module that imports it back. Two cycles existed (quantize <->
compare.sensitivity through the float_layers choice, trt.build <-> trt.calibrator through build's
private helpers); this test fails if one comes back or a new one is added."""
import ast
from pathlib import Path
from typing import Dict, List, Set

TRTQ = Path(__file__).resolve().parents[1] / "trtq"


def _module_names() -> Dict[str, Path]:
    names = {}
    for path in TRTQ.rglob("*.py"):
        parts = path.relative_to(TRTQ.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def import_graph() -> Dict[str, Set[str]]:
    """module -> the trtq modules it imports anywhere in its file (a package counts as its __init__)."""
    modules = _module_names()

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                if t.split(".")[0] == "trtq" and owner(t) not in ("", module):
                    graph[module].add(owner(t))
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "trtq.trt.network" in graph["trtq.trt.calibrator"]  # imported inside a function there
    assert "trtq.compare.sensitivity" in graph["trtq.pipeline.quantize"]


def test_trtq_has_no_import_cycle():
    assert cycles(import_graph()) == []
