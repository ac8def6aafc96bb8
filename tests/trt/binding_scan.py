"""Static scan of trtq's TensorRT uses (``ast``), version-independent.

:func:`scan` reads the modules of ``trtq/trt/`` and returns every place trtq touches a TensorRT
name as a :class:`Use`. Receivers are *symbolic types* (tuples), resolved later against one
version's binding surface by :mod:`tests.trt.binding_check`:

  ("mod",)                   the ``tensorrt`` module
  ("attr", T, name)          attribute ``name`` of T (a class, an enum member, a method, a property)
  ("call", T)                what calling T gives (an instance, a method's return value)
  ("sub", qualname, bases)   a class trtq derives from TensorRT classes (bases: tuple of T)
  ("union", (T, ...))        one of several (``getattr(trt, CLASSES[key])``)

What the scan sees
- ``trt``: a parameter or variable named ``trt``, ``self.trt`` / ``s.trt``, ``import tensorrt`` and
  ``compat.import_tensorrt()``; every attribute chain and call from there (``trt.BuilderFlag.INT8``,
  ``trt.Builder(logger)``), ``getattr(X, "name"[, default])`` and ``hasattr(X, "name")`` with
  constant names, names taken from a module-level dict of constants (``CLASSES[key]``).
- Local variables take the type of what was assigned (``config = builder.create_builder_config()``
  is whatever ``Builder.create_builder_config`` returns in the version checked); functions of the
  scanned modules return the type of their ``return`` expressions (``compat.make_logger``).
- Parameters (and attributes such as ``self.engine``) get a type from trtq's naming convention
  :data:`CONVENTION` (``config`` is an ``IBuilderConfig``) when they are not annotated with a
  concrete type; every assignment to a conventional name is checked to give that type.
- Calls: the number of positional arguments, keyword names and, where the scan knows an
  argument's type (a literal, ``int()`` / ``str()`` / ``bytes()``, a parameter annotated ``int`` /
  ``str`` / ``bytes`` / ``bool``, a TensorRT object or enum member, a scanned function's return
  annotation), that type against the parameter's type in the pybind11 signature.
- Assignments to attributes of TensorRT objects (a writable property), classes derived from
  TensorRT classes (each method overriding the base's takes as many arguments as TensorRT passes;
  a method the base lacks must be used by trtq), and ``Base.__init__(self)`` calls.
- Where a use applies (``Use.conds``, all must hold in a version for the use to be checked there):
  ``hasattr``/``getattr(..., None)`` probes are never required; a use guarded by a probe
  (``if hasattr(config, "x"): config.x(...)``, or after ``if not hasattr(...): return``) is checked
  where the probed name exists; a use under ``if compat.P(trt)`` (P a ``(trt) -> bool`` function of
  compat, such as ``has_implicit_int8``) where P holds on the real module; a use under
  ``if recipe.F`` (F a bool field of ``compat.BuildRecipe``) where some ``plan_build`` recipe of
  that version sets F; statements after a call to a function that raises unless P holds
  (``calibrator_base``); and a private function used only from such places inherits the
  conditions common to all its calls.
- Names looked up with ``getattr(enum, name)`` in a loop over a parameter are uses at each call
  with constant names; names that come from ``plan_build``'s recipe (``recipe.builder_flags``,
  ``.creation_flags``) are covered by running ``plan_build`` and the mask functions on the real
  module (``binding_exercise``); a dynamic name checked with ``hasattr`` first (user input) is
  allowed. Any other dynamic name is reported as ``unseen``.

What it cannot see: types through containers, tuple unpacking, lambdas and attributes of
non-TensorRT objects outside the convention; values returned by TensorRT as lists or tuples;
``else`` branches of compound conditions; version comparisons (``version_of(trt).major >= 10``):
a use under one is checked in every version. cuda-python is not scanned.
"""

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

MOD = ("mod",)

# trtq's names for TensorRT objects passed between functions (checked where they are assigned)
CONVENTION = {
    "builder": "Builder",
    "network": "INetworkDefinition",
    "config": "IBuilderConfig",
    "parser": "OnnxParser",
    "runtime": "Runtime",
    "engine": "ICudaEngine",
    "context": "IExecutionContext",
    "profile": "IOptimizationProfile",
    "inspector": "EngineInspector",
}
# recipe fields that carry builder / creation flag names (covered by binding_exercise)
RECIPE_NAME_FIELDS = ("builder_flags", "creation_flags")
_BUILTIN_CALLS = {
    "int": "int",
    "str": "str",
    "bytes": "bytes",
    "bool": "bool",
    "float": "float",
    "len": "int",
    "tuple": "tuple",
    "list": "list",
    "dict": "dict",
    "memoryview": "memoryview",
}
_ANNOTATIONS = {"int": "int", "str": "str", "bytes": "bytes", "bool": "bool", "float": "float"}


@dataclass
class Use:
    kind: str  # attr | probe | call | set | override | convention | dynamic
    recv: Any  # symbolic type of the receiver (attr/probe/set/override/dynamic) or of the callee (call)
    name: str = ""
    where: str = ""
    conds: frozenset = frozenset()
    npos: int = 0  # call: positional arguments; override: the override's positional parameters
    kwnames: tuple = ()
    star: bool = False  # call with *args / **kwargs: counts not checked
    argtypes: tuple = ()  # call: static types of the positional arguments (None: unknown)
    kwtypes: tuple = ()  # call: (name, type) pairs
    value: Any = None  # set: static type of the assigned value; convention: expected class
    required: int = 0  # override: positional parameters without defaults
    varargs: bool = False  # override: takes *args
    note: str = ""  # dynamic: how the names are covered

    def label(self) -> str:
        return f"{self.where}: {self.kind} {show(self.recv)}{'.' + self.name if self.name else ''}"


def show(t: Any) -> str:
    """A readable form of a symbolic type: ``trt.Builder().create_network()``."""
    if t is None:
        return "?"
    tag = t[0]
    if tag == "mod":
        return "trt"
    if tag == "attr":
        return f"{show(t[1])}.{t[2]}"
    if tag == "call":
        return f"{show(t[1])}()"
    if tag == "sub":
        return t[1]
    if tag == "union":
        return "(" + " | ".join(show(x) for x in t[1]) + ")"
    if tag == "conv":
        return t[1]
    return repr(t)


@dataclass
class FuncInfo:
    module: str
    qualname: str
    node: Any
    params: list
    ensures: frozenset = frozenset()  # predicate conditions that hold after a call returns
    returns: Any = None  # symbolic type of the return value
    return_annotation: Optional[str] = None  # builtin type name from the annotation
    dyn_params: dict = field(default_factory=dict)  # param name -> symbolic enum looked up with its items
    calls: list = field(default_factory=list)  # (callee key, conds) of calls from this function
    cond: Optional[frozenset] = None  # conditions under which the function runs at all
    internal: bool = False
    ncalls: int = 0  # calls from the scanned modules


@dataclass
class ScanResult:
    uses: list
    functions: dict
    predicates: tuple  # compat functions (trt) -> bool, evaluated per version
    recipe_fields: tuple  # BuildRecipe bool fields
    unseen: list  # dynamic uses the scan could not resolve


def _const_str(node: Any) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _const_strs(node: Any) -> Optional[list]:
    if isinstance(node, (ast.Tuple, ast.List)) and all(_const_str(e) is not None for e in node.elts):
        return [e.value for e in node.elts]
    s = _const_str(node)
    return [s] if s is not None else None


def _ends_flow(body: list) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Raise, ast.Return, ast.Continue, ast.Break))


def _negate(cond: tuple) -> tuple:
    pairs = {"has": "hasnot", "pred": "notpred", "recipe": "notrecipe", "known": "unknown"}
    back = {v: k for k, v in pairs.items()}
    tag = cond[0]
    return ((pairs.get(tag) or back[tag]),) + cond[1:]


class _Module:
    def __init__(self, name: str, tree: Any, source_name: str):
        self.name, self.tree, self.source_name = name, tree, source_name
        self.constants: dict = {}  # NAME -> list of constant strings (dict values / tuple items)
        self.aliases: dict = {}  # local name -> ("module", modname) | ("func", modname, fname)
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                v = node.value
                if isinstance(v, ast.Dict) and all(_const_str(x) is not None for x in v.values):
                    self.constants[node.targets[0].id] = [x.value for x in v.values]


class Scanner:
    def __init__(self, files: dict, package: str = "trtq.trt", outside_refs: Optional[set] = None):
        """files: module name -> source text; outside_refs: names referenced outside the package
        (functions named there are public: called in every version)."""
        self.modules = {name: _Module(name, ast.parse(src), name) for name, src in files.items()}
        self.package = package
        self.outside_refs = outside_refs or set()
        self.functions: dict = {}
        self.classes: dict = {}  # qualname -> ("sub", qualname, bases) for TensorRT-derived classes
        self.uses: list = []
        self.unseen: list = []
        self.predicates: tuple = ()
        self.recipe_fields: tuple = ()
        self.attr_names: set = set()
        self.method_names: set = set()  # methods of the scanned classes (not TensorRT objects)

    # -- module-level facts ----------------------------------------------------------------------

    def _collect(self) -> None:
        compat = self.modules.get(f"{self.package}.compat")
        preds, fields = [], []
        for mod in self.modules.values():
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.Attribute):
                    self.attr_names.add(node.attr)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                    s = _const_str(node.args[1]) if len(node.args) > 1 else None
                    if s:
                        self.attr_names.add(s)
            for node in mod.tree.body:
                if isinstance(node, ast.FunctionDef):
                    self._add_function(mod, node, node.name)
                elif isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef):
                            self._add_function(mod, item, f"{node.name}.{item.name}")
                            self.method_names.add(item.name)
        if compat is not None:
            for node in compat.tree.body:
                if (
                    isinstance(node, ast.FunctionDef)
                    and [a.arg for a in node.args.args] == ["trt"]
                    and isinstance(node.returns, ast.Name)
                    and node.returns.id == "bool"
                ):
                    preds.append(node.name)
                if isinstance(node, ast.ClassDef) and node.name == "BuildRecipe":
                    for item in node.body:
                        if (
                            isinstance(item, ast.AnnAssign)
                            and isinstance(item.annotation, ast.Name)
                            and item.annotation.id == "bool"
                        ):
                            fields.append(item.target.id)
        self.predicates, self.recipe_fields = tuple(sorted(preds)), tuple(fields)
        for key, f in self.functions.items():
            f.internal = key[1].split(".")[-1] not in self.outside_refs

    def _add_function(self, mod: _Module, node: Any, qualname: str) -> None:
        params = [a.arg for a in node.args.args + node.args.kwonlyargs]
        ann = node.returns.id if isinstance(node.returns, ast.Name) else None
        self.functions[(mod.name, qualname)] = FuncInfo(
            mod.name, qualname, node, params, return_annotation=_ANNOTATIONS.get(ann or "")
        )

    # -- the scan ----------------------------------------------------------------------------------

    def run(self) -> ScanResult:
        self._collect()
        # returns, ensured predicates and conditions depend on each other across modules: a few passes
        for final in (False, False, False, True):
            self.uses, self.unseen = [], []
            for f in self.functions.values():
                _FunctionScan(self, f, record=final).scan()
            self._propagate_conditions()
        for f in self.functions.values():
            for pname in sorted(f.dyn_params):
                if not f.internal or not f.ncalls:
                    self.unseen.append(
                        f"{f.module}:{f.node.lineno} {f.qualname}: names for "
                        f"{f.qualname}({pname}=...) come from outside the scanned calls"
                    )
        return ScanResult(self.uses, self.functions, self.predicates, self.recipe_fields, self.unseen)

    def _propagate_conditions(self) -> None:
        sites: dict = {}
        for f in self.functions.values():
            for callee, conds in f.calls:
                sites.setdefault(callee, []).append((f, conds))
        for key, f in self.functions.items():
            calls = sites.get(key, [])
            f.ncalls = len(calls)
            if not f.internal or not calls:
                f.cond = frozenset()
                continue
            common = None
            for caller, conds in calls:
                total = conds | (caller.cond or frozenset())
                common = total if common is None else common & total
            f.cond = common or frozenset()

    def resolve_call_target(self, mod: _Module, func: Any, env: dict) -> Optional[tuple]:
        """(module, qualname) of a scanned function called as ``f(...)`` or ``compat.f(...)``."""
        if isinstance(func, ast.Name):
            alias = env.get(("alias", func.id)) or mod.aliases.get(func.id)
            if alias and alias[0] == "func":
                return alias[1], alias[2]
            if (mod.name, func.id) in self.functions:
                return mod.name, func.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            alias = env.get(("alias", func.value.id)) or mod.aliases.get(func.value.id)
            if alias and alias[0] == "module" and (alias[1], func.attr) in self.functions:
                return alias[1], func.attr
        return None


class _FunctionScan:
    """One function body: a linear walk with an environment of symbolic types and a stack of
    conditions."""

    def __init__(self, scanner: Scanner, func: FuncInfo, record: bool):
        self.s, self.f, self.record = scanner, func, record
        self.mod = scanner.modules[func.module]
        self.returns: list = []
        self.calls: list = []
        self.quiet = False
        self.ensures: set = set()

    # -- environment -----------------------------------------------------------------------------

    def scan(self) -> None:
        env: dict = {}
        node = self.f.node
        args = node.args.args + node.args.kwonlyargs
        cls_name = self.f.qualname.split(".")[0] if "." in self.f.qualname else None
        for i, a in enumerate(args):
            env[a.arg] = self._param_type(a, i, cls_name)
        self._imports_in(self.mod.tree.body, env, top=True)
        self._block(node.body, env, frozenset(), top=True)
        f = self.f
        typed = [r for r in self.returns if r is not None]
        f.returns = (
            typed[0]
            if typed and all(r == typed[0] for r in typed)
            else (("union", tuple(dict.fromkeys(typed))) if typed else None)
        )
        f.ensures = frozenset(self.ensures)
        f.calls = self.calls

    def _param_type(self, a: Any, index: int, cls_name: Optional[str]) -> Any:
        if a.arg == "trt":
            return MOD
        if index == 0 and a.arg == "self" and cls_name is not None:
            return self.s.classes.get(f"{self.f.module}.{cls_name}", {"self": cls_name})
        ann = a.annotation
        if isinstance(ann, ast.Name) and ann.id in _ANNOTATIONS:
            return ("py", _ANNOTATIONS[ann.id])
        if (
            isinstance(ann, ast.Subscript)
            and isinstance(ann.value, ast.Name)
            and ann.value.id == "Optional"
            and isinstance(ann.slice, ast.Name)
            and ann.slice.id in _ANNOTATIONS
        ):
            return ("py", _ANNOTATIONS[ann.slice.id])
        concrete = ann is not None and not (isinstance(ann, ast.Name) and ann.id == "Any")
        if a.arg in CONVENTION and not concrete:
            return ("conv", a.arg)
        return None

    def _imports_in(self, body: list, env: dict, top: bool = False) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    local = alias.asname or alias.name
                    full = f"{node.module}.{alias.name}"
                    if full in self.s.modules:
                        env[("alias", local)] = ("module", full)
                    elif (node.module, alias.name) in self.s.functions:
                        env[("alias", local)] = ("func", node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "tensorrt":
                        env[alias.asname or "tensorrt"] = MOD

    # -- statements --------------------------------------------------------------------------------

    def _block(self, body: list, env: dict, conds: frozenset, top: bool = False) -> None:
        conds = frozenset(conds)
        for stmt in body:
            self._imports_in([stmt], env)
            if isinstance(stmt, ast.If):
                tconds = self._conditions(stmt.test, env)
                self._expr(stmt.test, env, conds)
                neg = [_negate(c) for c in tconds] if len(tconds) == 1 and not isinstance(stmt.test, ast.BoolOp) else []
                self._branches(env, [(stmt.body, conds | frozenset(tconds)), (stmt.orelse, conds | frozenset(neg))])
                if _ends_flow(stmt.body) and not stmt.orelse:
                    # `if not hasattr(x, "n"): return` -> the rest runs where x.n exists
                    rest = self._exit_conditions(stmt.test, env)
                    conds = conds | frozenset(rest)
                    if top:
                        self.ensures.update(c for c in rest if c[0] == "pred")
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor)):
                self._expr(stmt.iter, env, conds)
                if isinstance(stmt.target, ast.Name):
                    src = stmt.iter
                    env[stmt.target.id] = ("loop", src.id) if isinstance(src, ast.Name) else None
                self._branches(env, [(stmt.body, conds), (stmt.orelse, conds)])
                continue
            if isinstance(stmt, ast.While):
                self._expr(stmt.test, env, conds)
                self._branches(env, [(stmt.body, conds)])
                continue
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    self._expr(item.context_expr, env, conds)
                self._block(stmt.body, env, conds, top=top)
                continue
            if isinstance(stmt, ast.Try):
                self._block(stmt.body, env, conds, top=top)
                self._branches(env, [(h.body, conds) for h in stmt.handlers] + [(stmt.orelse, conds)])
                self._block(stmt.finalbody, env, conds)
                continue
            if isinstance(stmt, ast.ClassDef):
                self._class(stmt, env, conds)
                continue
            if isinstance(stmt, ast.FunctionDef):
                continue  # nested functions are scanned as methods of their class, if any
            if isinstance(stmt, ast.Return):
                if stmt.value is not None:
                    self.returns.append(self._expr(stmt.value, env, conds))
                continue
            if isinstance(stmt, ast.Assign):
                t = self._expr(stmt.value, env, conds)
                if t is None:
                    st = self._static(stmt.value, env)
                    t = ("py", st) if isinstance(st, str) else None
                for target in stmt.targets:
                    self._assign(target, t, stmt.value, env, conds)
                callee = self._callee_key(stmt.value, env)
                if callee is not None:  # `base = calibrator_base(trt, ...)`: its guarantees hold from here
                    conds = conds | self.s.functions[callee].ensures
                continue
            if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                t = self._expr(stmt.value, env, conds) if stmt.value is not None else None
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    self._assign(stmt.target, t, stmt.value, env, conds)
                continue
            if isinstance(stmt, ast.Expr):
                self._expr(stmt.value, env, conds)
                callee = self._callee_key(stmt.value, env)
                if callee is not None:
                    conds = conds | self.s.functions[callee].ensures
                continue
            if isinstance(stmt, ast.Raise) and stmt.exc is not None:
                self._expr(stmt.exc, env, conds)
                continue
            if isinstance(stmt, ast.Delete):
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        env.pop(t.id, None)
                continue
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, ast.expr):
                    self._expr(child, env, conds)
        return None

    def _branches(self, env: dict, branches: list) -> None:
        """Scan alternative blocks on copies of ``env``; a name keeps any type a branch gave it."""
        results = []
        for body, conds in branches:
            if body:
                inner = dict(env)
                self._block(body, inner, conds)
                results.append(inner)
        for k in {k for inner in results for k in inner}:
            candidates = [env.get(k)] + [inner.get(k) for inner in results]
            typed = [v for v in candidates if self._is_trt(v)]
            known = [v for v in candidates if v is not None]
            env[k] = typed[0] if typed else known[0] if known else None

    def _callee_key(self, node: Any, env: dict) -> Optional[tuple]:
        if isinstance(node, ast.Call):
            return self.s.resolve_call_target(self.mod, node.func, env)
        return None

    def _assign(self, target: Any, t: Any, value: Any, env: dict, conds: frozenset) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = t
            if target.id in CONVENTION and t is not None and t[0] not in ("conv", "py"):
                self._use(Use("convention", t, value=CONVENTION[target.id]), target, conds)
        elif isinstance(target, ast.Attribute):
            recv = self._expr(target.value, env, conds)
            own = self.s.classes.get(recv[1][1] + "#own", ()) if self._is_sub_instance(recv) else ()
            if self._is_trt(recv) and target.attr not in own:
                self._use(Use("set", recv, target.attr, value=self._static(value, env)), target, conds)
            elif target.attr in CONVENTION and t is not None and t[0] not in ("conv", "py"):
                self._use(Use("convention", t, value=CONVENTION[target.attr]), target, conds)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                if isinstance(elt, ast.Name):
                    env[elt.id] = None
        else:
            self._expr(target, env, conds)

    def _class(self, node: Any, env: dict, conds: frozenset) -> None:
        bases = [self._expr(b, env, conds) for b in node.bases]
        trt_bases = tuple(b for b in bases if self._is_trt(b))
        if not trt_bases:
            return
        qual = f"{self.f.module}.{node.name}"
        sub = ("sub", qual, trt_bases)
        self.s.classes[qual] = sub
        env[node.name] = sub
        own = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
        for item in ast.walk(node):
            if (
                isinstance(item, ast.Attribute)
                and isinstance(item.value, ast.Name)
                and item.value.id == "self"
                and isinstance(item.ctx, ast.Store)
            ):
                own.add(item.attr)
        self.s.classes[qual + "#own"] = frozenset(own)
        for item in node.body:
            if not isinstance(item, ast.FunctionDef):
                continue
            a = item.args
            npos = len(a.args)
            required = npos - len(a.defaults)
            for base in trt_bases:
                if item.name == "__init__":
                    continue
                u = Use(
                    "override",
                    base,
                    item.name,
                    npos=npos,
                    required=required,
                    varargs=a.vararg is not None,
                    value=item.name in self.s.attr_names,
                )
                self._use(u, item, conds)
            inner = dict(env)
            inner["self"] = ("call", sub)
            for i, arg in enumerate(a.args[1:], 1):
                inner[arg.arg] = self._param_type(arg, i, None)
            self._block(item.body, inner, conds)

    # -- conditions --------------------------------------------------------------------------------

    def _conditions(self, test: Any, env: dict) -> list:
        """Conditions that hold inside ``if test:``."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            out = []
            for v in test.values:
                out.extend(self._conditions(v, env))
            return out
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._conditions(test.operand, env)
            return [_negate(inner[0])] if len(inner) == 1 else []
        if isinstance(test, ast.Call):
            fn = test.func
            if isinstance(fn, ast.Name) and fn.id == "hasattr" and len(test.args) == 2:
                recv, name = self._expr_quiet(test.args[0], env), _const_str(test.args[1])
                if self._is_trt(recv) and name:
                    return [("has", recv, name)]
                if isinstance(test.args[1], ast.Name):
                    return [("known", recv, test.args[1].id)]
            key = self.s.resolve_call_target(self.mod, fn, env)
            if key is not None and key[0] == f"{self.s.package}.compat":
                if key[1] in self.s.predicates:
                    return [("pred", key[1])]
                if key[1] == "_enum_has" and len(test.args) == 2:
                    recv, name = self._expr_quiet(test.args[0], env), _const_str(test.args[1])
                    if self._is_trt(recv) and name:
                        return [("has", recv, name)]
        if isinstance(test, ast.Attribute) and test.attr in self.s.recipe_fields:
            return [("recipe", test.attr)]
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
            and isinstance(test.left, ast.Name)
        ):
            t = env.get(test.left.id)
            if t is not None and t[0] == "attr" and isinstance(test.ops[0], ast.IsNot):
                return [("has", t[1], t[2])]
        return []

    def _exit_conditions(self, test: Any, env: dict) -> list:
        """Conditions that hold after ``if test: return``."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
            out = []
            for v in test.values:
                out.extend(self._exit_conditions(v, env))
            return out
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Is)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
            and isinstance(test.left, ast.Name)
        ):
            t = env.get(test.left.id)
            if t is not None and t[0] == "attr":
                return [("has", t[1], t[2])]
            return []
        inner = self._conditions(test, env)
        return [_negate(inner[0])] if len(inner) == 1 else []

    # -- expressions -------------------------------------------------------------------------------

    def _is_sub_instance(self, t: Any) -> bool:
        return isinstance(t, tuple) and len(t) == 2 and t[0] == "call" and t[1][0] == "sub"

    def _is_trt(self, t: Any) -> bool:
        return isinstance(t, tuple) and bool(t) and t[0] in ("mod", "attr", "call", "sub", "union", "conv")

    def _expr_quiet(self, node: Any, env: dict) -> Any:
        """The type of ``node`` without recording uses or calls (they are recorded where the
        expression is scanned in its place)."""
        record, quiet, self.record, self.quiet = self.record, self.quiet, False, True
        try:
            return self._expr(node, env, frozenset())
        finally:
            self.record, self.quiet = record, quiet

    def _use(self, use: Use, node: Any, conds: frozenset) -> None:
        if not self.record:
            return
        use.where = f"{self.mod.source_name}:{getattr(node, 'lineno', 0)} {self.f.qualname}"
        use.conds = frozenset(conds) | (self.f.cond or frozenset())
        self.s.uses.append(use)

    def _expr(self, node: Any, env: dict, conds: frozenset) -> Any:
        if node is None:
            return None
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in self.s.classes:
                return self.s.classes[node.id]
            return None
        if isinstance(node, ast.Attribute):
            recv = self._expr(node.value, env, conds)
            if isinstance(recv, dict) or recv is None or not self._is_trt(recv):
                if node.attr == "trt":
                    return MOD
                if node.attr in CONVENTION and node.attr not in self.s.method_names:
                    return ("conv", node.attr)
                return None
            if recv[0] == "sub" or (recv[0] == "call" and recv[1][0] == "sub"):
                sub = recv if recv[0] == "sub" else recv[1]
                if node.attr in self.s.classes.get(sub[1] + "#own", ()):
                    return None  # trtq's own attribute
                bases = sub[2]
                recv_t = bases[0] if recv[0] == "sub" else ("call", bases[0])
                self._use(Use("attr", recv_t, node.attr), node, conds)
                return ("attr", recv_t, node.attr)
            self._use(Use("attr", recv, node.attr), node, conds)
            return ("attr", recv, node.attr)
        if isinstance(node, ast.Call):
            return self._call(node, env, conds)
        if isinstance(node, ast.IfExp):
            tconds = frozenset(self._conditions(node.test, env))
            self._expr(node.test, env, conds)
            a = self._expr(node.body, env, conds | tconds)
            b = self._expr(node.orelse, env, conds)
            return a if a is not None else b
        if isinstance(node, ast.BoolOp):
            extra: set = set()
            last = None
            for v in node.values:
                last = self._expr(v, env, conds | frozenset(extra))
                if isinstance(node.op, ast.And):
                    extra.update(self._conditions(v, env))
            return last if isinstance(node.op, ast.Or) else None
        if isinstance(node, ast.Subscript):
            self._expr(node.value, env, conds)
            self._expr(node.slice, env, conds)
            return None
        if isinstance(node, ast.Lambda):
            return None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._expr(child, env, conds)
            elif isinstance(child, ast.comprehension):
                self._expr(child.iter, env, conds)
                for test in child.ifs:
                    self._expr(test, env, conds)
        return None

    def _static(self, node: Any, env: dict) -> Any:
        """Static type of an argument: a builtin name, ("trt", T) or None."""
        if isinstance(node, ast.Constant):
            v = node.value
            return "None" if v is None else type(v).__name__
        if isinstance(node, (ast.Tuple, ast.List, ast.Dict)):
            return {ast.Tuple: "tuple", ast.List: "list", ast.Dict: "dict"}[type(node)]
        if isinstance(node, ast.JoinedStr):
            return "str"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _BUILTIN_CALLS
            and node.func.id not in env
        ):
            return _BUILTIN_CALLS[node.func.id]
        if isinstance(node, ast.Call):
            key = self.s.resolve_call_target(self.mod, node.func, env)
            if key is not None and self.s.functions[key].return_annotation:
                return self.s.functions[key].return_annotation
        t = self._expr_quiet(node, env)
        if isinstance(t, tuple) and t and t[0] == "py":
            return t[1]
        if self._is_trt(t):
            return ("trt", t)
        return None

    def _call(self, node: Any, env: dict, conds: frozenset) -> Any:
        fn = node.func
        args = node.args
        # getattr / hasattr with constant names
        if isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr") and len(args) >= 2:
            recv = self._expr(args[0], env, conds)
            name = _const_str(args[1])
            names = None
            if name is None and isinstance(args[1], ast.Subscript) and isinstance(args[1].value, ast.Name):
                names = self.mod.constants.get(args[1].value.id)
            self._expr(args[1], env, conds)
            if not self._is_trt(recv):
                return None
            probe = fn.id == "hasattr" or len(args) > 2
            if name is not None:
                self._use(Use("probe" if probe else "attr", recv, name), node, conds)
                return None if fn.id == "hasattr" else ("attr", recv, name)
            if names:
                for n in names:
                    self._use(Use("probe" if probe else "attr", recv, n), node, conds)
                return ("union", tuple(("attr", recv, n) for n in names))
            var = args[1].id if isinstance(args[1], ast.Name) else None
            src = env.get(var) if var else None
            if fn.id == "hasattr":
                return None
            if var and ("known", recv, var) in conds:
                self._use(Use("dynamic", recv, note="names checked with hasattr first"), node, conds)
            elif src is not None and src[0] == "loop" and src[1] in self.f.params:
                self.f.dyn_params[src[1]] = recv
            elif var and var in self.f.params:
                self.f.dyn_params[var] = recv
            else:
                self._use(Use("dynamic", recv, note="unseen"), node, conds)
                if self.record:
                    self.s.unseen.append(
                        f"{self.mod.source_name}:{node.lineno} {self.f.qualname}: "
                        f"getattr({show(recv)}, <{ast.unparse(args[1])}>)"
                    )
            return None
        if (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")) == "import_tensorrt":
            return MOD  # compat.import_tensorrt(), in any package
        callee_t = self._expr(fn, env, conds)
        argtypes = tuple(self._static(a, env) for a in args if not isinstance(a, ast.Starred))
        kw = [(k.arg, self._static(k.value, env)) for k in node.keywords if k.arg is not None]
        star = any(isinstance(a, ast.Starred) for a in args) or any(k.arg is None for k in node.keywords)
        for a in args:
            self._expr(a.value if isinstance(a, ast.Starred) else a, env, conds)
        for k in node.keywords:
            self._expr(k.value, env, conds)
        key = self.s.resolve_call_target(self.mod, fn, env)
        if key is not None:
            callee = self.s.functions[key]
            if not self.quiet:
                self.calls.append((key, frozenset(conds)))
            self._dynamic_args(callee, node, env, conds)
            if key == (f"{self.s.package}.compat", "import_tensorrt"):
                return MOD
            return callee.returns
        if self._is_trt(callee_t):
            if callee_t[0] != "sub":  # a trtq subclass: its own __init__ (Base.__init__ calls are checked)
                self._use(
                    Use(
                        "call",
                        callee_t,
                        npos=len(argtypes),
                        kwnames=tuple(k for k, _ in kw),
                        star=star,
                        argtypes=argtypes,
                        kwtypes=tuple(kw),
                    ),
                    node,
                    conds,
                )
            return ("call", callee_t)
        return None

    def _dynamic_args(self, callee: FuncInfo, node: Any, env: dict, conds: frozenset) -> None:
        """Names passed to a function that looks them up with getattr (``set_builder_flags``)."""
        if not callee.dyn_params:
            return
        params = callee.params
        bound = dict(zip(params, node.args))
        bound.update({k.arg: k.value for k in node.keywords if k.arg})
        for pname, recv in callee.dyn_params.items():
            arg = bound.get(pname)
            if arg is None:
                continue
            names = _const_strs(arg)
            if names is not None:
                for n in names:
                    self._use(Use("attr", recv, n), node, conds)
            elif isinstance(arg, ast.Attribute) and arg.attr in RECIPE_NAME_FIELDS:
                self._use(
                    Use("dynamic", recv, note=f"recipe.{arg.attr}: plan_build run on the real module"), node, conds
                )
            else:
                self._use(Use("dynamic", recv, note="unseen"), node, conds)
                if self.record:
                    self.s.unseen.append(
                        f"{self.mod.source_name}:{node.lineno} {self.f.qualname}: names for "
                        f"{callee.qualname}({pname}=...) the scan cannot see"
                    )


def scan_package(root: Path, package: str = "trtq.trt", outside: Optional[Path] = None) -> ScanResult:
    """Scan every module of ``root`` (the folder of ``package``); ``outside``: the folder whose other
    modules decide which functions are public."""
    files = {}
    for path in sorted(Path(root).glob("*.py")):
        mod = package if path.stem == "__init__" else f"{package}.{path.stem}"
        files[mod] = path.read_text(encoding="utf-8")
    refs: set = set()
    if outside is not None:
        for path in Path(outside).rglob("*.py"):
            if Path(root) in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Name):
                    refs.add(node.id)
                elif isinstance(node, ast.Attribute):
                    refs.add(node.attr)
                elif isinstance(node, ast.alias):
                    refs.add(node.name.split(".")[-1])
    scanner = Scanner(files, package, refs)
    return scanner.run()
