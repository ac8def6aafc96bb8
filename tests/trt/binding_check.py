"""Check the uses found by :mod:`tests.trt.binding_scan` against one version's binding surface
(the JSON of :mod:`tests.trt.binding_introspect`).

For each use whose conditions hold in that version:
  attr        the name exists (module name, class member, enum member, method, property)
  probe       nothing required (``hasattr`` / ``getattr(..., default)``); counted when present
  call        some overload takes the positional count and keyword names, and every argument whose
              type the scan knows fits the parameter's type
  set         a writable property, and the value's type fits it
  override    the base has the method and the override takes the arguments TensorRT passes; a method
              the base lacks must be one trtq calls itself
  convention  a conventional name (``config``) was given the class the convention says
  dynamic     names the scan cannot see: only those covered by running ``plan_build`` on the real
              module or checked with ``hasattr`` are allowed
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from tests.trt.binding_scan import CONVENTION, show

INT_TYPES = {"int", "typing.SupportsInt", "SupportsInt", "typing.SupportsIndex", "SupportsIndex"}
FLOAT_TYPES = {"float", "typing.SupportsFloat", "SupportsFloat"}
BYTES_TYPES = {"bytes", "buffer", "typing_extensions.Buffer", "collections.abc.Buffer", "bytearray"}
SEQ_PREFIXES = ("tuple", "list", "collections.abc.Sequence", "typing.Sequence", "Dims", "Sequence")


class Missing(Exception):
    """A name the binding lacks."""


class Unresolved(Exception):
    """A receiver whose type is not a TensorRT class (a list, an unannotated return)."""


@dataclass
class Report:
    version: str
    names: set = field(default_factory=set)  # "IBuilderConfig.set_flag", "BuilderFlag.INT8", "trt.Builder"
    enum_members: set = field(default_factory=set)
    calls: set = field(default_factory=set)  # call sites whose signature was checked
    problems: list = field(default_factory=list)
    not_applicable: list = field(default_factory=list)  # uses whose conditions are false here
    covered: list = field(default_factory=list)  # dynamic names covered another way

    def summary(self) -> str:
        return (
            f"TensorRT {self.version}: {len(self.names)} names ({len(self.enum_members)} enum members), "
            f"{len(self.calls)} call signatures checked, {len(self.not_applicable)} uses not applicable, "
            f"{len(self.problems)} problems"
        )


def strip_module(t: str) -> str:
    t = t.strip()
    for prefix in ("tensorrt.tensorrt.", "tensorrt_bindings.tensorrt.", "tensorrt."):
        t = t.replace(prefix, "")
    return t


class Surface:
    def __init__(self, doc: dict):
        self.doc = doc
        self.module = doc["module"]
        self.version = doc.get("version", "?")
        self.exercised = doc.get("exercised") or {}

    def entry(self, path: str) -> Optional[dict]:
        parts = path.split(".")
        e = self.module.get(parts[0])
        for p in parts[1:]:
            if e is None:
                return None
            e = e.get("members", {}).get(p)
        return e if e is not None and e.get("kind") == "class" else None

    def class_for(self, typename: str, near: str = "") -> Optional[str]:
        """The class path a type string names (``tensorrt.tensorrt.ILogger.Severity``).

        pybind11 writes the C++ name of a class registered after the function that returns it
        (``nvinfer1::IEngineInspector``): that is looked up by its last part, then without the
        interface prefix ``I`` (the Python class is ``EngineInspector``)."""
        t = strip_module(typename)
        if near and self.entry(f"{near}.{t}"):
            return f"{near}.{t}"
        if "::" in t and "<" not in t and "[" not in t:
            last = t.split("::")[-1]
            for name in (last, last[1:] if last.startswith("I") else None):
                if name and self.entry(name):
                    return name
        return t if self.entry(t) else None

    def from_sequence(self, path: str) -> bool:
        """The class has a constructor taking one sequence (``Dims(shape: List[int])``)."""
        init = (self.entry(path) or {}).get("members", {}).get("__init__") or {}
        for sig in init.get("signatures") or []:
            rest = [p for p in sig["params"][1:] if p["kind"] == "pos"]
            seq = ("List[", "list[", "collections.abc.Sequence[", "typing.Sequence[", "Sequence[")
            if len(rest) == 1 and strip_module(rest[0]["type"]).startswith(seq):
                return True
        return False

    def bases(self, path: str) -> list:
        e = self.entry(path) or {}
        return list(e.get("bases", []))

    def is_a(self, path: str, wanted: str) -> bool:
        return path == wanted or wanted.split(".")[-1] in self.bases(path)

    # -- resolution ------------------------------------------------------------------------------

    def type_value(self, typename: str, near: str = "") -> tuple:
        """What a value of the given (docstring) type is."""
        t = strip_module(typename)
        for wrap in ("typing.Optional[", "Optional["):
            if t.startswith(wrap) and t.endswith("]"):
                t = t[len(wrap) : -1]
        if t.endswith(" | None"):
            t = t[: -len(" | None")]
        path = self.class_for(t, near)
        if path:
            return ("instance", path)
        if t in INT_TYPES:
            return ("py", "int")
        if t in FLOAT_TYPES:
            return ("py", "float")
        if t in ("str", "bool", "bytes", "None"):
            return ("py", t)
        return ("py", t or "object")

    def resolve(self, t: Any) -> list:
        """Alternatives a symbolic type resolves to (several for a union: those that exist)."""
        tag = t[0]
        if tag == "mod":
            return [("module",)]
        if tag == "conv":
            return [("instance", CONVENTION[t[1]])]
        if tag == "union":
            out = []
            for alt in t[1]:
                try:
                    out.extend(self.resolve(alt))
                except Missing:
                    continue  # union alternatives come from probes: a missing one is allowed
            if not out:
                raise Missing(f"none of {show(t)}")
            return out
        if tag == "sub":
            return [("subclass", t[1], tuple(r for b in t[2] for r in self._try(b)))]
        if tag == "attr":
            return [self.member(r, t[2]) for r in self.resolve(t[1])]
        if tag == "call":
            return [self.called(r) for r in self.resolve(t[1])]
        raise Unresolved(f"unknown symbolic type {t!r}")

    def _try(self, t: Any) -> list:
        try:
            return self.resolve(t)
        except Missing:
            return []

    def member(self, r: tuple, name: str) -> tuple:
        tag = r[0]
        if tag == "module":
            e = self.module.get(name)
            if e is None:
                raise Missing(f"trt.{name}")
            if e["kind"] == "class":
                return ("class", name)
            if e["kind"] == "function":
                return ("function", name, e)
            return self.type_value(e.get("type", ""))
        if tag in ("class", "instance"):
            path = r[1]
            e = self.entry(path) or {}
            m = e.get("members", {}).get(name)
            if m is None:
                raise Missing(f"{path}.{name}")
            if m["kind"] == "class":
                return ("class", f"{path}.{name}")
            if m["kind"] == "method":
                return ("method", path, name, tag == "instance", m)
            if m["kind"] == "static":
                return ("function", f"{path}.{name}", m)
            if m["kind"] == "property":
                if tag == "class":
                    return ("py", "property")
                return self.type_value(m.get("type", ""), near=path)
            return self.type_value(m.get("type", ""), near=path)
        if tag == "subinstance":
            for base in r[2]:
                try:
                    return self.member(("instance", base[1]) if base[0] == "class" else base, name)
                except Missing:
                    continue
            raise Missing(f"{r[1]}.{name}")
        if tag == "subclass":
            for base in r[2]:
                try:
                    return self.member(base, name)
                except Missing:
                    continue
            raise Missing(f"{r[1]}.{name}")
        raise Unresolved(f"attribute {name!r} of a {r[1] if tag == 'py' else tag}")

    def called(self, r: tuple) -> tuple:
        tag = r[0]
        if tag == "class":
            return ("instance", r[1])
        if tag == "subclass":
            return ("subinstance", r[1], r[2])
        if tag in ("method", "function"):
            sigs = r[-1].get("signatures") or []
            if not sigs:
                raise Unresolved(f"no signature for {r[1]}")
            return self.type_value(sigs[0].get("returns", ""), near=r[1] if tag == "method" else "")
        raise Unresolved(f"call of a {tag}")

    # -- type fit ----------------------------------------------------------------------------------

    def arg_value(self, arg: Any) -> Any:
        """A static argument type as ("py", name) / ("instance", path) / ("subinstance", ...) or None."""
        if arg is None:
            return None
        if isinstance(arg, str):
            return ("py", arg)
        try:
            alts = self.resolve(arg[1])
        except (Missing, Unresolved):
            return None
        return alts[0] if len(alts) == 1 else None

    def fits(self, ptype: str, arg: Any) -> bool:
        v = self.arg_value(arg)
        if v is None or not ptype:
            return True
        p = strip_module(ptype)
        optional = p.startswith(("typing.Optional[", "Optional[")) or p.endswith(" | None")
        for wrap in ("typing.Optional[", "Optional["):
            if p.startswith(wrap) and p.endswith("]"):
                p = p[len(wrap) : -1]
        if p.endswith(" | None"):
            p = p[: -len(" | None")]
        if v == ("py", "None"):
            return optional or p in ("None", "object", "typing.Any")
        kind, what = v[0], v[1]
        cls = self.class_for(p)
        if kind == "py":
            if cls:
                # a Python value where TensorRT wants one of its objects: only a sequence for a class
                # built from one (Dims: the bindings convert tuples and lists implicitly)
                return what in ("tuple", "list") and self.from_sequence(cls)
            if p in INT_TYPES:
                return what in ("int", "bool")
            if p in FLOAT_TYPES:
                return what in ("int", "float", "bool")
            if p == "bool":
                return what in ("bool", "int")
            if p == "str":
                return what in ("str", "bytes")
            if p in BYTES_TYPES:
                return what in ("bytes", "bytearray", "memoryview")
            if p.startswith(SEQ_PREFIXES):
                return what in ("tuple", "list")
            return True  # a type the check does not model (numpy arrays, capsules ...)
        # a TensorRT object
        path = what if kind == "instance" else None
        bases = [b[1] for b in v[2] if b[0] in ("class", "instance")] if kind == "subinstance" else []
        if cls:
            return any(self.is_a(x, cls) for x in ([path] if path else bases))
        if p in INT_TYPES:
            return bool(path) and "enum" in (self.entry(path) or {})
        return not (p in ("str", "bool") or p in BYTES_TYPES or p in FLOAT_TYPES)


def _binds(sig: dict, use: Any, bound: bool, surface: Surface) -> Optional[str]:
    """None when ``use`` (a call) fits ``sig``, else why not."""
    params = sig["params"]
    pos = [p for p in params if p["kind"] == "pos"]
    varargs = any(p["kind"] == "varargs" for p in params)
    varkw = any(p["kind"] == "varkw" for p in params)
    argtypes = ((None,) if bound else ()) + tuple(use.argtypes)
    npos = use.npos + (1 if bound else 0)
    named = {p["name"]: p for p in params if p["kind"] in ("pos", "kwonly")}
    for k in use.kwnames:
        if k not in named and not varkw:
            return f"no parameter {k!r}"
    if use.star:
        return None
    if npos > len(pos) and not varargs:
        return f"takes {len(pos) - (1 if bound else 0)} positional arguments, trtq passes {use.npos}"
    filled = {p["name"] for p in pos[:npos]}
    for k in use.kwnames:
        if k in filled:
            return f"{k!r} given twice"
    filled |= set(use.kwnames)
    missing = [
        p["name"] for p in params if p["kind"] in ("pos", "kwonly") and not p["default"] and p["name"] not in filled
    ]
    if missing:
        return "missing " + ", ".join(missing)
    for p, a in zip(pos, argtypes):
        if not surface.fits(p["type"], a):
            return f"argument {p['name']!r} wants {strip_module(p['type'])}, trtq passes {_show_arg(a)}"
    for k, a in use.kwtypes:
        if k in named and not surface.fits(named[k]["type"], a):
            return f"argument {k!r} wants {strip_module(named[k]['type'])}, trtq passes {_show_arg(a)}"
    return None


def _show_arg(a: Any) -> str:
    return a if isinstance(a, str) else show(a[1]) if a else "?"


def _sig_text(name: str, sig: dict) -> str:
    parts = []
    for p in sig["params"]:
        star = {"varargs": "*", "varkw": "**"}.get(p["kind"], "")
        parts.append(
            f"{star}{p['name']}"
            + (f": {strip_module(p['type'])}" if p["type"] else "")
            + (" = ..." if p["default"] else "")
        )
    return f"{name}({', '.join(parts)})"


def applies(use: Any, surface: Surface) -> bool:
    facts = surface.exercised
    for c in use.conds:
        tag = c[0]
        if tag in ("known", "unknown"):
            continue
        if tag in ("has", "hasnot"):
            try:
                for r in surface.resolve(c[1]):
                    surface.member(r, c[2])
                present = True
            except (Missing, Unresolved):
                present = False
            if present != (tag == "has"):
                return False
        elif tag in ("pred", "notpred"):
            value = facts.get("predicates", {}).get(c[1])
            if value is not None and bool(value) != (tag == "pred"):
                return False
        elif tag in ("recipe", "notrecipe"):
            seen = facts.get("recipe_fields", {}).get(c[1])
            if seen is not None and (tag == "recipe") not in seen:
                return False
    return True


def _label(r: tuple, name: str) -> str:
    if r[0] == "module":
        return f"trt.{name}"
    return f"{r[1]}.{name}"


def check(uses: list, surface: Surface) -> Report:
    rep = Report(surface.version)
    for use in uses:
        if not applies(use, surface):
            rep.not_applicable.append(use.label())
            continue
        try:
            _check_one(use, surface, rep)
        except Missing as e:
            if use.kind != "probe":
                rep.problems.append(
                    f"{use.where}: unknown name {e} ({show(use.recv)}{'.' + use.name if use.name else ''})"
                )
        except Unresolved as e:
            rep.problems.append(f"{use.where}: cannot check {show(use.recv)}.{use.name}: {e}")
    _exercised_names(surface, rep)
    return rep


def _exercised_names(surface: Surface, rep: Report) -> None:
    """Flag names trtq looks up from plan_build's recipe, which ran on the real module."""
    for r in (surface.exercised.get("recipes") or {}).values():
        for enum, key in (("NetworkDefinitionCreationFlag", "creation_flags"), ("BuilderFlag", "builder_flags")):
            for name in r.get(key, []):
                if name not in ((surface.entry(enum) or {}).get("enum") or {}):
                    rep.problems.append(f"plan_build names {enum}.{name}, which the binding lacks")
                rep.names.add(f"{enum}.{name}")
                rep.enum_members.add(f"{enum}.{name}")


def _check_one(use: Any, surface: Surface, rep: Report) -> None:
    kind = use.kind
    if kind == "dynamic":
        if use.note == "unseen":
            rep.problems.append(f"{use.where}: names looked up on {show(use.recv)} that the scan cannot see")
        else:
            rep.covered.append(f"{use.where}: {show(use.recv)}: {use.note}")
        return
    if kind == "convention":
        for r in surface.resolve(use.recv):
            path = r[1] if r[0] == "instance" else None
            if path is None or not surface.is_a(path, use.value):
                rep.problems.append(
                    f"{use.where}: {show(use.recv)} gives {path or r[0]}, but trtq's name for it means {use.value}"
                )
        return
    for r in surface.resolve(use.recv):
        if kind == "call":
            _check_call(use, r, surface, rep)
            continue
        if kind == "override":
            _check_override(use, r, surface, rep)
            continue
        m = surface.member(r, use.name)
        rep.names.add(_label(r, use.name))
        if r[0] == "class" and "enum" in (surface.entry(r[1]) or {}) and use.name in surface.entry(r[1])["enum"]:
            rep.enum_members.add(_label(r, use.name))
        if kind == "set":
            e = (surface.entry(r[1]) or {}).get("members", {}).get(use.name, {}) if r[0] == "instance" else {}
            if e.get("kind") != "property":
                rep.problems.append(f"{use.where}: {_label(r, use.name)} is not a property that can be set")
            elif e.get("readonly"):
                rep.problems.append(f"{use.where}: {_label(r, use.name)} is read-only")
            elif not surface.fits(e.get("type", ""), use.value):
                rep.problems.append(
                    f"{use.where}: {_label(r, use.name)} wants {strip_module(e['type'])}, "
                    f"trtq sets {_show_arg(use.value)}"
                )
        del m


def _check_call(use: Any, r: tuple, surface: Surface, rep: Report) -> None:
    tag = r[0]
    if tag == "class":
        init = (surface.entry(r[1]) or {}).get("members", {}).get("__init__")
        if init is None:
            rep.problems.append(f"{use.where}: {r[1]} cannot be constructed from Python")
            return
        sigs, bound, name = init.get("signatures") or [], True, f"{r[1]}"
    elif tag == "method":
        sigs, bound, name = r[4].get("signatures") or [], r[3], f"{r[1]}.{r[2]}"
    elif tag == "function":
        sigs, bound, name = r[2].get("signatures") or [], False, r[1]
    elif tag in ("subclass", "subinstance"):
        return
    else:
        rep.problems.append(f"{use.where}: {show(use.recv)} is a {r[1] if tag == 'py' else tag}, not callable")
        return
    if not sigs:
        rep.problems.append(f"{use.where}: no signature for {name} in the binding: the call cannot be checked")
        return
    rep.calls.add(f"{use.where} {name}")
    reasons = [_binds(sig, use, bound, surface) for sig in sigs]
    if all(reasons):
        shown = "; ".join(_sig_text(name, s) for s in sigs)
        rep.problems.append(f"{use.where}: {name} does not take this call ({reasons[0]}); binding: {shown}")


def _check_override(use: Any, r: tuple, surface: Surface, rep: Report) -> None:
    if r[0] != "class":
        rep.problems.append(f"{use.where}: base {show(use.recv)} is not a class")
        return
    try:
        m = surface.member(r, use.name)
    except Missing:
        if not use.value:
            rep.problems.append(f"{use.where}: {use.name} overrides nothing in {r[1]} and trtq never calls it")
        return
    rep.names.add(_label(r, use.name))
    if m[0] != "method":
        rep.problems.append(f"{use.where}: {_label(r, use.name)} is not a method")
        return
    sigs = m[4].get("signatures") or []
    if not sigs:
        return
    wanted = sum(1 for p in sigs[0]["params"] if p["kind"] == "pos")
    if (use.npos < wanted and not use.varargs) or use.required > wanted:
        rep.problems.append(
            f"{use.where}: {use.name} takes {use.npos} positional parameters "
            f"({use.required} required); TensorRT calls it with {wanted}: "
            f"{_sig_text(_label(r, use.name), sigs[0])}"
        )
