"""Describe an imported ``tensorrt`` module as JSON: run as a script in a subprocess.

    python binding_introspect.py PACKAGE_DIR [REPO]

PACKAGE_DIR holds the binding's ``tensorrt/`` package (``__init__.py`` + ``tensorrt.so``); the
libraries it links must already be loadable (the harness puts stub libraries on
LD_LIBRARY_PATH). With REPO, trtq's version decisions are also run on the real module
(``exercised``). Prints one JSON document on stdout.

It runs in whatever Python the binding was built for (3.9 for TensorRT 8.6.0), so it uses the
standard library only and stays compatible with old Pythons: no annotations evaluated at run time.

The description, per module-level name:
  {"kind": "class", "bases": [...], "members": {name: member}, "enum": {member: value} (enums)}
  {"kind": "function", "signatures": [signature, ...]}
  {"kind": "value", "type": "str", "value": "10.16.1.11"}   (str/int/bool values; else no "value")
member: {"kind": "method" | "static", "signatures": [...]}, {"kind": "property", "readonly": bool,
"type": "..."}, {"kind": "value", "type": ..., "value": int} (class attributes such as the
exported enum members ``ILogger.ERROR``) or a nested class description.
signature: {"params": [{"name", "type", "default": bool, "kind": "pos" | "kwonly" | "varargs" |
"varkw"}], "returns": "..."}; the first parameter of a method is ``self``.
pybind11 writes every overload's signature as the first line(s) of ``__doc__``; those lines are
the source. A callable without such a line gets a signature from :mod:`inspect` (functions the
package's ``__init__.py`` adds in Python) or ``"signatures": []`` (unknown: calls to it are not
checked).
"""

import inspect
import json
import re
import sys

_KEEP_DUNDERS = ("__init__", "__call__", "__len__", "__getitem__", "__iter__", "__enter__", "__exit__")


def split_top(text, sep=","):
    """Split at ``sep`` outside brackets and quotes."""
    parts, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>" and depth > 0:
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def parse_params(text):
    params, kwonly = [], False
    for raw in split_top(text):
        if raw == "/":
            continue
        if raw == "*":
            kwonly = True
            continue
        kind = "kwonly" if kwonly else "pos"
        if raw.startswith("**"):
            kind, raw = "varkw", raw[2:]
        elif raw.startswith("*"):
            kind, raw, kwonly = "varargs", raw[1:], True
        default = False
        head = raw
        eq = split_top(raw, "=")
        if len(eq) > 1:
            head, default = eq[0], True
        name, _, typ = head.partition(":")
        params.append({"name": name.strip(), "type": typ.strip(), "default": default, "kind": kind})
    return params


def _closing(text, start):
    """Index of the parenthesis closing the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def doc_signatures(name, doc):
    """Every ``name(...) -> T`` line pybind11 put in ``doc`` (one per overload)."""
    out = []
    if not doc:
        return out
    pattern = re.compile(r"^(?:\d+\.\s+)?" + re.escape(name) + r"\(")
    for line in doc.splitlines():
        line = line.strip()
        m = pattern.match(line)
        if not m:
            continue
        open_at = m.end() - 1
        close = _closing(line, open_at)
        if close < 0:
            continue
        rest = line[close + 1 :].strip()
        returns = rest[2:].strip() if rest.startswith("->") else ""
        params = parse_params(line[open_at + 1 : close])
        if [p["kind"] for p in params] == ["varargs", "varkw"] and "Overloaded function" in doc:
            continue  # the umbrella line of an overload set
        out.append({"params": params, "returns": returns})
    return out


def property_type(prop):
    doc = getattr(prop.fget, "__doc__", None) or ""
    m = re.match(r"\s*\(.*?\)\s*->\s*(.+)", doc.splitlines()[0] if doc else "")
    return m.group(1).strip() if m else ""


def python_signature(func):
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    kinds = {
        inspect.Parameter.VAR_POSITIONAL: "varargs",
        inspect.Parameter.VAR_KEYWORD: "varkw",
        inspect.Parameter.KEYWORD_ONLY: "kwonly",
    }
    params = [
        {
            "name": p.name,
            "type": "",
            "default": p.default is not inspect.Parameter.empty,
            "kind": kinds.get(p.kind, "pos"),
        }
        for p in sig.parameters.values()
    ]
    return [{"params": params, "returns": ""}]


def signatures(name, obj):
    sigs = doc_signatures(name, getattr(obj, "__doc__", None))
    if not sigs and (inspect.isfunction(obj) or inspect.ismethod(obj)):
        sigs = python_signature(obj)
    return sigs


def enum_members(cls):
    members = getattr(cls, "__members__", None)
    if not isinstance(members, dict) or not hasattr(cls, "__int__"):
        return None
    out = {}
    for k, v in members.items():
        try:
            out[k] = int(v)
        except (TypeError, ValueError):
            out[k] = None
    return out


def plain_value(v):
    if isinstance(v, (bool, int, str)) and not hasattr(type(v), "__members__"):
        return v
    try:
        if hasattr(type(v), "__members__"):
            return int(v)
    except (TypeError, ValueError):
        pass
    return None


def static_lookup(cls, name):
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name], klass
    return None, None


def describe_class(cls, depth=0):
    entry = {"kind": "class", "bases": [b.__name__ for b in cls.__mro__[1:] if b is not object], "members": {}}
    enum = enum_members(cls)
    if enum is not None:
        entry["enum"] = enum
    for name in dir(cls):
        if name.startswith("_") and name not in _KEEP_DUNDERS:
            continue
        raw, owner = static_lookup(cls, name)
        if owner is object or (owner is not None and owner.__name__ == "pybind11_object"):
            continue  # e.g. pybind11's own __init__ of a class Python cannot construct
        if isinstance(raw, property):
            entry["members"][name] = {"kind": "property", "readonly": raw.fset is None, "type": property_type(raw)}
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            func = raw.__func__
            entry["members"][name] = {"kind": "static", "signatures": signatures(name, func)}
            continue
        value = getattr(cls, name, None)
        if isinstance(value, type):
            entry["members"][name] = describe_class(value, depth + 1) if depth < 2 else {"kind": "class"}
        elif callable(value):
            entry["members"][name] = {"kind": "method", "signatures": signatures(name, value)}
        else:
            item = {"kind": "value", "type": type(value).__name__}
            pv = plain_value(value)
            if pv is not None:
                item["value"] = pv
            entry["members"][name] = item
    return entry


def describe_module(mod):
    out = {}
    for name in dir(mod):
        if name.startswith("_") and name != "__version__":
            continue
        obj = getattr(mod, name)
        if inspect.ismodule(obj):
            continue
        if isinstance(obj, type):
            out[name] = describe_class(obj)
        elif callable(obj):
            out[name] = {"kind": "function", "signatures": signatures(name, obj)}
        else:
            item = {"kind": "value", "type": type(obj).__name__}
            pv = plain_value(obj)
            if pv is not None:
                item["value"] = pv
            out[name] = item
    return out


def main(argv):
    sys.path.insert(0, argv[1])
    import tensorrt

    doc = {
        "version": str(getattr(tensorrt, "__version__", "")),
        "python": "{}.{}".format(*sys.version_info[:2]),
        "module": describe_module(tensorrt),
    }
    if len(argv) > 2:
        sys.path.insert(1, argv[2])
        from tests.trt.binding_exercise import exercise

        doc["exercised"] = exercise(tensorrt)
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
