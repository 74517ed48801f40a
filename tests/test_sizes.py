"""Issue 36's size limits, kept by the suite instead of by review: no
Python file in bulkhead/ over 400 lines, no function over 60."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bulkhead"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(path: Path) -> list[str]:
    """What in one file breaks a limit, as 'path:line what (lines)'."""
    source = path.read_text()
    found = []
    if source.count("\n") > MAX_FILE_LINES:
        found.append(f"{path}: {source.count(chr(10))} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path}:{node.lineno} {node.name}() {length} lines")
    return found


def test_no_file_or_function_in_the_package_is_over_its_limit():
    found = [f for p in sorted(PACKAGE.rglob("*.py")) for f in oversized(p)]
    assert found == []


def test_the_check_sees_a_long_function_and_a_long_file(tmp_path):
    body = "".join(f"    x = {i}\n" for i in range(MAX_FUNCTION_LINES))
    long_function = tmp_path / "f.py"
    long_function.write_text("def f():\n" + body)
    long_file = tmp_path / "g.py"
    long_file.write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    assert [s.split()[1] for s in oversized(long_function)] == ["f()"]
    assert oversized(long_file) == [f"{long_file}: {MAX_FILE_LINES + 1} lines"]
