"""The documentation: README.md is the front door (a short guide with the two commands), docs/ is
the rest, built as a site by MkDocs. A broken link, a missing anchor or a page left out of the nav
fails the strict build; README.md and CONTRIBUTING.md sit outside the site, so their links are
checked here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
# [text](target): a target with no scheme is a file of this repository, maybe with an #anchor.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (Python-Markdown's toc slugs)."""
    text = FENCE.sub("", page.read_text())
    return {slugify(match.group(1).strip(), "-") for match in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to check
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_docs_site_builds_strictly(tmp_path):
    # Strict: a link to a missing page or anchor, or a page of docs/ left out of the nav, fails it.
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = [page for entry in nav for page in entry.values()]
    assert sorted(pages) == sorted(path.name for path in (ROOT / "docs").glob("*.md"))
    for page in pages:
        assert (tmp_path / page.replace(".md", ".html")).exists(), page


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md"])
def test_every_relative_link_outside_the_site_resolves(name):
    assert broken_links(ROOT / name) == []


def test_the_link_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section, with words\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-section-with-words) [web](https://example.org/x) [gone](missing.md)\n"
                    "[bad](other.md#not-a-heading)\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#not-a-heading: no such heading"]


def test_the_readme_is_a_short_guide_with_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert re.search(r"^make run\s+#", readme, re.M) and re.search(r"^make test\s+#", readme, re.M)
    assert "exec make test" in (ROOT / ".ci" / "run").read_text()
    # It points at every page of the site.
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert linked == {path.name for path in (ROOT / "docs").glob("*.md")}
