"""Docs that describe today (issue 36): the three long reads stay within
their line caps, and every repository path a doc names in backticks or in a
code block is a file or folder that exists, so a doc cannot go on pointing at
a module that was moved or deleted."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# The ten-minute read, the figures with their commands, and the checker.
LINE_CAPS = {"architecture.md": 250, "performance.md": 400, "verification.md": 400}

TOP_LEVEL = ("bulkhead", "bench", "tests", "docs", "specs")  # named from the repository root
# The short form docs use inside bulkhead/ (`engine/engine.py`): one per subpackage.
SUBPACKAGES = tuple(p.name for p in (ROOT / "bulkhead").iterdir() if p.is_dir() and not p.name.startswith("_"))
OUTPUTS = ("bench/results/",)  # benchmarks write their results here (git-ignored)
INLINE = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
PATH = re.compile(r"^[\w.-]+(/[\w.-]+)+/?$")


def named_paths(text: str) -> set[str]:
    """Repository paths named in inline code or a fenced block: a token that
    starts with a top-level folder or one of bulkhead's subpackages. A
    `file.py:name` reference counts as file.py; a glob, a placeholder
    (`<commit>`) or a path that names no repository folder is not checked."""
    spans = INLINE.findall(FENCED.sub("", text)) + FENCED.findall(text)
    found = set()
    for token in (t for span in spans for t in span.split()):
        token = token.strip("\"'(),;").split(":")[0]
        if not PATH.match(token) or token.split("/")[0] not in TOP_LEVEL + SUBPACKAGES:
            continue
        if any(part.startswith(".") for part in token.split("/")[1:]) or token.startswith(OUTPUTS):
            continue  # what a script creates: a local build (bench/.venv-vllm) or a result file
        found.add(token)
    return found


def resolves(path: str) -> bool:
    head = path.split("/")[0]
    base = ROOT if head in TOP_LEVEL else ROOT / "bulkhead"
    return (base / path).exists()


@pytest.mark.parametrize("name", sorted(LINE_CAPS))
def test_the_long_reads_stay_within_their_caps(name):
    lines = len((DOCS / name).read_text().splitlines())
    assert lines <= LINE_CAPS[name], f"docs/{name} has {lines} lines, its cap is {LINE_CAPS[name]}"


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc):
    missing = sorted(p for p in named_paths(doc.read_text()) if not resolves(p))
    assert not missing, f"docs/{doc.name} names paths that do not exist: {missing}"


def test_a_made_up_path_is_caught():
    text = "The step is in `bulkhead/engine/engine.py`; see `engine/no_such_module.py:step`.\n" \
           "```\npython bench/no_such_bench.py --reps 3\n```\n"
    assert named_paths(text) == {"bulkhead/engine/engine.py", "engine/no_such_module.py", "bench/no_such_bench.py"}
    assert [p for p in sorted(named_paths(text)) if not resolves(p)] == ["bench/no_such_bench.py",
                                                                          "engine/no_such_module.py"]
