"""The README a newcomer reads in five minutes (issue 34 item 9): at most 150
lines, the two set-up commands first, and every relative link in it and in
docs/ pointing at a file that exists."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)


def test_the_readme_fits_in_150_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the reference belongs in docs/"


def test_the_first_code_block_holds_the_two_set_up_commands():
    first = re.search(r"```[a-z]*\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["make serve", "make test"], first


def _relative_links(path: Path) -> list[str]:
    targets = LINK.findall(path.read_text())
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    missing = [t for t in _relative_links(doc) if not (doc.parent / t.split("#")[0]).exists()]
    assert not missing, f"{doc.name}: {missing}"


def test_the_readme_links_every_doc():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in _relative_links(README)}
    assert not {p.resolve() for p in (ROOT / "docs").glob("*.md")} - linked
