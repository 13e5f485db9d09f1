"""The front page and the manuals name commands that exist: every `make` target in a README.md or docs/ command
(fenced blocks and the quick-start table) is a Makefile target, every `python -m` module is importable, every script
is there, and every relative link points at a file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(page: Path) -> list[str]:
    """Shell lines of the page's fenced bash blocks and of its tables' first column."""
    text = page.read_text()
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    lines += re.findall(r"^\| `([^`]+)` \|", text, re.M)
    return [line.split("#")[0].strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))


def missing(page: Path) -> list[str]:
    """What the page's commands name that is not there."""
    targets, out = make_targets(), []
    for line in commands(page):
        for part in re.split(r"&&|;|\|", line):
            words = part.split()
            if not words:
                continue
            if words[0] == "make":
                out += [f"make target {w}" for w in words[1:] if not w.startswith("-") and "=" not in w
                        and w not in targets]
            elif words[0] in ("python", "python3") and words[1:2] == ["-m"]:
                out += [] if importlib.util.find_spec(words[2]) is not None else [f"module {words[2]}"]
            elif words[0] == "specheads":
                from specheads.cli import COMMANDS

                out += [] if words[1:2] and words[1] in COMMANDS else [f"specheads command {words[1:2]}"]
            elif words[0].endswith(".sh"):
                out += [] if (ROOT / words[0]).is_file() else [f"script {words[0]}"]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_a_page_names_exists(page):
    assert not missing(page)


def test_a_page_naming_what_is_not_there_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\nmake trian && python -m evaluation.simulat\nscripts/nothing.sh\n```\n| `make test` |\n")
    assert missing(page) == ["make target trian", "module evaluation.simulat", "script scripts/nothing.sh"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_points_at_a_file(page):
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
        if not link.startswith(("http://", "https://")):
            assert (page.parent / link).exists(), f"{page.name} links to {link}, which is not there"


def test_the_front_page_fits_a_screenful_of_sections():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_make_help_lists_every_target_in_pipeline_order_within_100_columns():
    text = (ROOT / "Makefile").read_text()
    described = dict(re.findall(r"^([a-z][a-z-]*):.*## (.*)$", text, re.M))
    order = re.search(r"^HELP_ORDER := (.*?)(?<!\\)$", text, re.M | re.S).group(1).replace("\\\n", " ").split()
    assert sorted(order) == sorted(described), "HELP_ORDER and the described targets differ"
    assert order.index("labels") < order.index("train") < order.index("eval")
    for target, words in described.items():
        assert len(f"  make {target:<16} {words}") <= 100, target
