"""No lab notes in trtq's code: measured timings, memory figures, accuracy in dB and speed-ups
belong in docs/decisions.md or benchmarks/README.md (with the command that measured them), where
they can be dated and re-measured; a comment or docstring says what the code does and why, and
points there. Definitions (``8 MiB of float32``, ``c = 128 s``, a ``2 x 2`` window, ``>= 4x``
rules) are not lab notes."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

TRTQ = Path(__file__).resolve().parents[1] / "trtq"

LAB_NOTE = re.compile(
    "|".join(
        [
            r"(?<![\w.])\d+(?:\.\d+)?\s*(?:ms|µs|us|ns)\b",  # a timing
            r"(?<![\w.])\d+\.\d+\s*s\b",  # seconds with a fraction (an integer `s` is often a scale)
            r"(?<![\w.])\d+(?:\.\d+)?\s*(?:MB|GB|KB|kB)\b",  # a measured size (definitions use MiB / GiB)
            r"[+~]\s*\d+(?:\.\d+)?\s*(?:MiB|GiB)\b",  # a measured difference in memory
            r"(?<![\w.])\d+(?:\.\d+)?\s*dB\b",  # an accuracy figure
            r"(?<![\w.])\d+\.\d+x\b",  # a measured speed-up
            r"(?<![\w.])\d+(?:\.\d+)?x\s+(?:faster|slower|the speed|their speed|as fast)\b",
        ]
    )
)


def comment_and_docstring_lines(path: Path):
    """(line, text) of every comment and docstring line of a .py file, every comment line of C."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        for m in re.finditer(r"/\*.*?\*/|//[^\n]*", source, flags=re.S):
            first = source.count("\n", 0, m.start()) + 1
            yield from ((first + i, line) for i, line in enumerate(m.group(0).split("\n")))
        return
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            yield from ((body[0].lineno + i, line) for i, line in enumerate(body[0].value.value.split("\n")))


def lab_notes(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the comment and docstring lines of ``path`` that carry a lab note, in order."""
    return sorted((n, text.strip()) for n, text in comment_and_docstring_lines(path) if LAB_NOTE.search(text))


def test_the_check_finds_lab_notes_and_leaves_definitions(tmp_path):
    notes = [
        "# took 3.5 s",
        "# 55 -> 33 ms on 2 cores",
        "# peak 1050 MB",
        "# +460 MiB peak RSS",
        "# 17.6 -> 22.0 dB",
        "# about 1.7x the scalar loop",
        "# the Add form was 3x slower",
    ]
    fine = [
        "# elements per task (8 MiB of float32)",
        "# c = 128 s: the shift",
        "# the 2 x 2 source pixels",
        "# anchors >= 4x the row length",
        "# protobuf's 2 GiB",
        "# a 1x1 conv",
    ]
    src = tmp_path / "m.py"
    src.write_text('"""Module: 0.8 s of inference."""\n' + "\n".join(notes + fine) + "\n")
    assert [text for _, text in lab_notes(src)] == ["Module: 0.8 s of inference.", *notes]
    c = tmp_path / "k.c"
    c.write_text("/* the AVX2 loop,\n * 1.7x faster on an EPYC */\nint x; // 2 x 2\n")
    assert lab_notes(c) == [(2, "* 1.7x faster on an EPYC */")]


def test_trtq_comments_and_docstrings_carry_no_lab_notes():
    found = [
        f"{path.relative_to(TRTQ.parent)}:{n}: {text}"
        for path in sorted(TRTQ.rglob("*"))
        if path.suffix in (".py", ".c", ".h")
        for n, text in lab_notes(path)
    ]
    assert found == [], "move these figures to docs/decisions.md or benchmarks/README.md:\n" + "\n".join(found)
