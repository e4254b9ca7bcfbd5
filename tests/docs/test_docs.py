"""Every code block of README.md and docs/ runs in a test or says why it cannot, every
option it names exists, every relative link resolves, the generated references match the
code, and the site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.docs import generate
from tests.docs.blocks import (
    ROOT,
    TOUR,
    all_blocks,
    doc_files,
    relative_links,
    syntax_problem,
    unknown_cli_options,
    unknown_spark_options,
)


def test_every_block_runs_or_says_why_not() -> None:
    blocks = all_blocks()
    assert blocks, "no code blocks found"
    unmarked = [b.where for b in blocks if not b.marker]
    assert not unmarked, (
        "blocks neither run nor marked: precede each with <!-- docs: tour --> (README.md) "
        "or <!-- docs: why it cannot run here -->: " + ", ".join(unmarked)
    )
    stray = [b.where for b in blocks if b.marker == TOUR and b.path.name != "README.md"]
    assert not stray, f"only README.md's tour runs blocks marked 'tour': {stray}"


def test_blocks_are_valid_code() -> None:
    problems = [p for b in all_blocks() if (p := syntax_problem(b))]
    assert not problems, "\n".join(problems)


def test_blocks_name_only_real_options() -> None:
    parsers = generate.cli_parsers()
    problems: list[str] = []
    for block in all_blocks():
        if block.language == "shell":
            problems += unknown_cli_options(block, parsers)
        else:
            problems += unknown_spark_options(block)
    assert not problems, "\n".join(problems)


def test_relative_links_resolve() -> None:
    problems = [p for path in doc_files() for p in relative_links(path)]
    assert not problems, "\n".join(problems)


def test_generated_references_are_current() -> None:
    stale = [
        str(page.relative_to(ROOT))
        for page, render in generate.PAGES.items()
        if not page.exists() or page.read_text() != render()
    ]
    assert not stale, f"out of date, run `python -m tests.docs.generate`: {stale}"


def test_site_builds_strict(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# How the project was worked on is git's to tell: no "the fourth stop", dated rows or
# issue numbers in what users read.
_DIARY = re.compile(
    r"\b(first|second|third|[a-z]+th|\d+(st|nd|rd|th)) stop\b|\b20\d\d-\d\d-\d\d\b"
    r"|\bissue \d+|\bthis (morning|session)\b",
    re.I,
)


def test_docs_describe_the_software_not_its_history() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {match.group(0)}"
        for path in doc_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if (match := _DIARY.search(line))
    ]
    assert not found, "\n".join(found)


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines"
    long_cells = [
        f"README.md:{n}"
        for n, line in enumerate(lines, 1)
        if line.startswith("|") and any(len(cell) > 300 for cell in line.split("|"))
    ]
    assert not long_cells, f"table cells over 300 characters: {long_cells}"
