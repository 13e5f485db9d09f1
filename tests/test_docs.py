"""The front page and the manuals name commands that exist, with flags they take: every `make` target in a README.md
or docs/ command (fenced blocks and the quick-start table) is a Makefile target, every `python -m` module is
importable, every script is there, every relative link points at a file; and every command the pages give with its
flags (`specheads …`, `python -m …`, `make … ARGS="…"`, in blocks or inline) parses those flags as the command
would, without running it. Running each stage on the tiny pair is the smoke run's (`make smoke`)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


LAUNCHER = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+|taskset\s+-c\s+\S+\s+)+")
"""What a timed command starts with before its command: environment settings and a ``taskset -c CPUS`` pin."""


def commands(page: Path) -> list[str]:
    """Shell lines of the page's fenced bash blocks and of its tables' first column, each without its launcher."""
    text = page.read_text()
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for line in block.replace("\\\n", " ").splitlines()]  # a continued line joined to the next
    lines += re.findall(r"^\| `([^`]+)` \|", text, re.M)
    return [LAUNCHER.sub("", line.split("#")[0].strip()) for line in lines
            if line.strip() and not line.lstrip().startswith("#")]


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))


def missing(page: Path) -> list[str]:
    """What the page's commands name that is not there."""
    targets, out = make_targets(), []
    for line in commands(page):
        for part in re.split(r"&&|;|\|", line):
            words = shlex.split(part)  # ARGS="--out x --checkpoints y" is one word
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
    page.write_text("```bash\nmake trian && python -m evaluation.simulat\nscripts/nothing.sh\nspecheads calibrate \\\n"
                    "    --out x && specheads calibrat \\\n  --out y\n```\n| `make test` |\n")
    assert missing(page) == ["make target trian", "module evaluation.simulat", "script scripts/nothing.sh",
                             "specheads command ['calibrat']"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_points_at_a_file(page):
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
        if not link.startswith(("http://", "https://")):
            assert (page.parent / link).exists(), f"{page.name} links to {link}, which is not there"


def test_the_front_page_fits_a_screenful_of_sections():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


FIRST_COMMANDS = ("make smoke", "make labels && make train")
"""What a cold reader runs first: the tiny pair, then the real one."""


def first_screen_problems(text: str) -> list[str]:
    """What keeps a page's first screen from telling a newcomer what to run: either first command missing from its
    first 30 lines, or a line outside code blocks over 120 characters (tables included) anywhere on it."""
    lines = text.splitlines()
    found = [f"no `{c}` in the first 30 lines" for c in FIRST_COMMANDS if not any(c in line for line in lines[:30])]
    in_code = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and len(line) > 120:
            found.append(f"line {number} is {len(line)} characters")
    return found


def test_the_front_page_says_what_to_run_first_in_lines_that_fit():
    assert first_screen_problems((ROOT / "README.md").read_text()) == []
    late = "\n".join(["# x"] + ["text"] * 30 + ["make smoke", "make labels && make train"])
    assert first_screen_problems(late) == ["no `make smoke` in the first 30 lines",
                                           "no `make labels && make train` in the first 30 lines"]
    wide = "make smoke\nmake labels && make train\n" + "| " + "x" * 130 + " |\n```\n" + "y" * 130 + "\n```\n"
    assert first_screen_problems(wide) == ["line 3 is 134 characters"]


def test_make_help_lists_every_target_in_pipeline_order_within_100_columns():
    text = (ROOT / "Makefile").read_text()
    described = dict(re.findall(r"^([a-z][a-z-]*):.*## (.*)$", text, re.M))
    order = re.search(r"^HELP_ORDER := (.*?)(?<!\\)$", text, re.M | re.S).group(1).replace("\\\n", " ").split()
    assert sorted(order) == sorted(described), "HELP_ORDER and the described targets differ"
    assert order.index("labels") < order.index("train") < order.index("eval")
    for target, words in described.items():
        assert len(f"  make {target:<16} {words}") <= 100, target


INLINE = re.compile(r"`((?:specheads|python -m|make) [^`]+)`")


def flagged_commands(page: Path) -> list[str]:
    """The page's command lines that give flags: blocks, tables and inline code spans; placeholders (``<…>``, shell
    substitutions) and elisions left out."""
    text = page.read_text()
    found = commands(page) + [" ".join(span.split()) for span in INLINE.findall(text)]  # spans wrap lines
    return sorted({c for c in found if re.search(r"(^|[\s\"'])--", c) and "--help" not in c
                   and not re.search(r"<|\$\(|…|\.\.\.|\[", c)})


class Parsed(BaseException):
    """Raised once a command's parser has read its flags: the command goes no further."""


def parse_only(argv: list[str], monkeypatch, main=None) -> None:
    """Run ``specheads`` (or another command's ``main``) with ``argv`` up to the end of its outermost parse (a
    subcommand's parser, such as LightningCLI's ``fit``, is parsed inside it and validated after): a flag it refuses
    exits 2 with its one line."""
    import sys

    import jsonargparse

    if main is None:
        from specheads.cli import main

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the command sets its own
    depth = [0]
    for cls in (argparse.ArgumentParser, jsonargparse.ArgumentParser):
        original = cls.parse_args

        def parse_then_stop(self, *args, _original=original, **kwargs):
            depth[0] += 1
            try:
                parsed = _original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise Parsed
            return parsed

        monkeypatch.setattr(cls, "parse_args", parse_then_stop)
    monkeypatch.setattr("specheads.cli.preload", lambda name: None)
    try:
        code = main(argv)
    except Parsed:
        return
    except SystemExit as e:
        code = e.code
    raise AssertionError(f"specheads {' '.join(argv)}: exit {code} before its flags were read")


def as_specheads(line: str) -> list[list[str]]:
    """``line`` as the ``specheads`` argument lists it runs (``make`` through its dry run, with the ARGS given)."""
    from specheads.cli import COMMANDS

    words = shlex.split(line)
    if words[0] == "specheads":
        return [words[1:]]
    if words[:2] == ["python", "-m"]:
        name = next(n for n, (module, _) in COMMANDS.items() if module == words[2])
        return [[name, *words[3:]]]
    dry = subprocess.run([*words, "-n"], capture_output=True, text=True, cwd=ROOT).stdout
    dry = dry.replace("\\\n", " ").splitlines()  # a recipe's continued lines, as the shell joins them
    return [shlex.split(run)[1:] for run in dry if run.startswith(".venv/bin/specheads ")]


@pytest.mark.parametrize("line", [c for page in PAGES for c in flagged_commands(page)])
def test_every_command_a_page_gives_parses_its_flags(line, monkeypatch, capsys):
    words = shlex.split(line)
    if words[:2] == ["python", "-m"] and words[2].startswith("scripts."):  # a script of ours, by its own parser
        parse_only(words[3:], monkeypatch, importlib.import_module(words[2]).main)
        return
    runs = as_specheads(line)
    assert runs, f"{line}: runs no specheads command"
    for argv in runs:
        parse_only(argv, monkeypatch)


def test_a_flag_a_command_does_not_take_is_caught(monkeypatch, capsys):
    with pytest.raises(AssertionError, match="exit 2"):
        parse_only(["simulate", "--labels", "x", "--timing-drfat", "d"], monkeypatch)
    with pytest.raises(AssertionError, match="exit 2"):
        parse_only(["eval", "--config", "configs/eval/llamacpp.yaml", "--prompts.limt", "3"], monkeypatch)
    parse_only(["eval", "--config", "configs/eval/llamacpp.yaml", "--prompts.limit", "3"], monkeypatch)
    with pytest.raises(AssertionError, match="exit 2"):  # a subcommand's parser, validated after the outer parse
        parse_only(["lightning", "fit", "--config", "configs/train/sprinter_lam1.yaml", "--model.lrr", "1"], monkeypatch)
    parse_only(["lightning", "fit", "--config", "configs/train/sprinter_lam1.yaml", "--model.lr", "1"], monkeypatch)
