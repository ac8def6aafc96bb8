"""trtq's import graph (imports inside functions included) follows the layers of docs/internals.md:
no cycle (a module may not import, directly or through others, a module that imports it back),
every import between packages points down a floor (never up, never sideways to a peer), and
there are at most 7 floors. A new top-level module or package must be given its floor here."""

from __future__ import annotations

import ast
from pathlib import Path

TRTQ = Path(__file__).resolve().parents[1] / "trtq"


def _module_names() -> dict[str, Path]:
    names = {}
    for path in TRTQ.rglob("*.py"):
        parts = path.relative_to(TRTQ.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


# the imports left out of the graph: trtq/__init__.py hands out the Python API's names on first use
# (PEP 562 __getattr__; test_the_front_door_is_imported_on_first_use_only): trtq.api's, and the
# packages trtq.quantize / trtq.compare, which are also the API's functions of their names. So
# `import trtq` stays core, and the API, a front door beside the CLI, sits on floor 7
FRONT_DOOR = {"trtq": {"trtq.api", "trtq.quantize", "trtq.compare"}}


def import_graph() -> dict[str, set[str]]:
    """module -> the trtq modules it imports anywhere in its file (a package counts as its __init__),
    less the front door's lazy imports (FRONT_DOOR)."""
    modules = _module_names()

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
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
    for module, lazy in FRONT_DOOR.items():
        graph[module] -= lazy
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
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


# floor of each group, bottom to top (docs/internals.md "Layers"); peers share a floor
FLOORS = {
    "core": 1,
    "data": 2,
    "calib": 3,
    "quantize": 4,
    "compare": 5,
    "trt": 5,
    "report": 5,
    "pipeline": 6,
    "cli": 7,
    "api": 7,
}
MAX_FLOORS = 7
# top-level modules of trtq/ that are core (they import only core) and the command line
CORE_MODULES = {
    "trtq",
    "trtq.errors",
    "trtq.fileio",
    "trtq.config",
    "trtq.model",
    "trtq.interrupt",
    "trtq.memory",
    "trtq.outputs",
    "trtq.qdq_info",
    "trtq.input_override",
    "trtq.formatting",
    "trtq.registry",
    "trtq.closing",
    "trtq.model_check",
    "trtq.opset_lower",
    "trtq.qdq_lower",
    "trtq.progress",
}
CLI_MODULES = {"trtq.cli", "trtq.__main__", "trtq.console"}


def group_of(module: str) -> str:
    """The layer group of a trtq module: core, cli, or its package under trtq/ ("" if unassigned)."""
    if module in CORE_MODULES:
        return "core"
    if module in CLI_MODULES:
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else ""


def layer_violations(graph: dict[str, set[str]], group=group_of, floors=FLOORS) -> list[str]:
    """Each import between groups that does not point down a floor, and each module without a group."""
    problems = [
        f"{m} has no floor: add it to tests/test_layers.py and docs/internals.md" for m in sorted(graph) if not group(m)
    ]
    for module in sorted(graph):
        for target in sorted(graph[module]):
            a, b = group(module), group(target)
            if not a or not b or a == b:
                continue
            if floors[b] == floors[a]:
                problems.append(f"{module} -> {target}: sideways ({a} and {b} are peers on floor {floors[a]})")
            elif floors[b] > floors[a]:
                problems.append(f"{module} -> {target}: upward ({a} is floor {floors[a]}, {b} floor {floors[b]})")
    return problems


# a package's lower part: it may not import the rest of its package, which may import it
# (docs/internals.md "Layers"): calib.collect gathers the statistics, calib says what they are
SUB_FLOORS = {"trtq.calib.collect": "trtq.calib"}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def sub_floor_violations(graph: dict[str, set[str]], sub_floors=SUB_FLOORS) -> list[str]:
    """Each import from a package's lower part (SUB_FLOORS) up into the rest of that package."""
    return [
        f"{module} -> {target}: upward inside {package} ({low} is below the rest of it)"
        for low, package in sub_floors.items()
        for module in sorted(graph)
        if _inside(module, low)
        for target in sorted(graph[module])
        if _inside(target, package) and not _inside(target, low)
    ]


def floor_count(graph: dict[str, set[str]], group=group_of) -> tuple[int, dict[str, int]]:
    """How many floors the group graph really stacks: each group one above the highest it imports."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges.setdefault(group(module), set()).update(group(t) for t in targets if group(t) != group(module))
    height: dict[str, int] = {}

    def rise(g: str, seen: tuple[str, ...] = ()) -> int:
        if g not in height:
            below = [rise(t, (*seen, g)) for t in edges.get(g, ()) if t not in seen]
            height[g] = 1 + max(below, default=0)
        return height[g]

    for g in edges:
        rise(g)
    return max(height.values(), default=0), height


def test_the_layer_check_finds_upward_and_sideways_imports():
    graph = {
        "trtq.model": {"trtq.data.batcher"},
        "trtq.data.batcher": set(),
        "trtq.trt.build": {"trtq.compare.onnx_runner", "trtq.quantize.fp16"},
        "trtq.compare.onnx_runner": set(),
        "trtq.quantize.fp16": set(),
        "trtq.newthing": set(),
    }
    assert layer_violations(graph) == [
        "trtq.newthing has no floor: add it to tests/test_layers.py and docs/internals.md",
        "trtq.model -> trtq.data.batcher: upward (core is floor 1, data floor 2)",
        "trtq.trt.build -> trtq.compare.onnx_runner: sideways (trt and compare are peers on floor 5)",
    ]


def test_the_floor_count_is_the_longest_chain_of_groups():
    graph = {
        "trtq.cli": {"trtq.pipeline.build"},
        "trtq.pipeline.build": {"trtq.trt.build"},
        "trtq.trt.build": {"trtq.model"},
        "trtq.model": set(),
        "trtq.data.batcher": {"trtq.model"},
    }
    assert floor_count(graph)[0] == 4


def test_every_import_points_down_a_floor():
    assert layer_violations(import_graph()) == []


def test_the_sub_floor_check_finds_an_import_up_into_its_package():
    graph = {
        "trtq.calib.collect.passes": {"trtq.calib.stats", "trtq.calib.collect.kernels", "trtq.model"},
        "trtq.calib.stats": {"trtq.calib.collect.kernels"},
        "trtq.calib.collect.kernels": set(),
    }
    assert sub_floor_violations(graph) == [
        "trtq.calib.collect.passes -> trtq.calib.stats: upward inside trtq.calib (trtq.calib.collect is below the "
        "rest of it)"
    ]


def test_calib_collect_imports_nothing_of_the_rest_of_calib():
    assert sub_floor_violations(import_graph()) == []


def test_trtq_has_at_most_seven_floors():
    count, height = floor_count(import_graph())
    assert count <= MAX_FLOORS, f"{count} floors: {sorted(height.items(), key=lambda kv: kv[1])}"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "trtq.trt.network" in graph["trtq.trt.calibrator"]  # imported inside a function there
    assert "trtq.compare.sensitivity" in graph["trtq.pipeline.quantize"]


def test_trtq_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_front_door_is_imported_on_first_use_only():
    """trtq/__init__.py imports the modules of FRONT_DOOR (the edges the graph leaves out) only inside
    functions, run on first use, and nothing else of trtq."""
    tree = ast.parse((TRTQ / "__init__.py").read_text(encoding="utf-8"))
    inside = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    imports = [n for n in imports if isinstance(n, ast.Import) or (n.module or "").startswith("trtq")]
    imports = [n for n in imports if not isinstance(n, ast.Import) or any(a.name.startswith("trtq") for a in n.names)]
    assert imports, "trtq/__init__.py hands out the API's names through imports"
    for node in imports:
        names = {a.name if isinstance(node, ast.Import) else f"{node.module}.{a.name}" for a in node.names}
        assert names <= FRONT_DOOR["trtq"], ast.dump(node)
        assert id(node) in inside, f"line {node.lineno}: {names} imported when trtq is"


MAX_FUNCTION_LINES = 80  # docs/internals.md: split a longer function into named steps


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (methods and nested ones included) longer than ``limit`` lines, as 'name (N lines)'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append(f"{node.name} ({length} lines)")
    return found


def test_the_length_check_finds_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    assert long_functions("def f():\n" + body) == ["f (81 lines)"]
    assert long_functions("def f():\n" + body[: -len("    x79 = 79\n")]) == []


def test_no_function_in_trtq_is_over_80_lines():
    problems = [
        f"{path.relative_to(TRTQ.parent)}: {name}"
        for path in sorted(TRTQ.rglob("*.py"))
        for name in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert problems == []
