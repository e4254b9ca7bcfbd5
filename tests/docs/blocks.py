"""The code blocks of README.md and docs/, and the checks every block passes.

A fenced block in one of ``LANGUAGES`` is preceded by an HTML comment that says what
happens to it: ``<!-- docs: tour -->`` (README.md only: ``test_tour`` runs it, in order,
against an embedded cluster and a local Spark), ``<!-- docs: cluster -->``
(``test_cluster_blocks`` runs it against an embedded cluster, its address in
``BOOTSTRAP``), or ``<!-- docs: REASON -->`` with the
reason it cannot run here (a multi-machine deployment, a Kafka listener on a fixed port):
such a block is only syntax-checked. Every block's ``quorumlog`` options and Spark
``.option`` names are checked against the CLI's parsers and ``connector/options.py``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANGUAGES = {"bash": "shell", "sh": "shell", "console": "shell", "python": "python"}
TOUR = "tour"
CLUSTER = "cluster"
_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs:\s*(.*?)\s*-->\s*$")
# Options of Spark's own stream writer that a block may set beside ours.
SPARK_WRITER_OPTIONS = {"checkpointlocation"}
_SHELL_BREAKS = {"|", "||", "&&", ";", "&", "(", ")", ">", ">>", "<", "$(", "`"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str  # "shell" or "python"
    marker: str | None  # the text after "docs:", or None
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.group(1), match.group(2), match.group(3).lower()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if lang in LANGUAGES:
            prev = i - 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
            marker = _MARKER.match(lines[prev]) if prev >= 0 else None
            body = [
                line[len(indent) :] if line.startswith(indent) else line
                for line in lines[i + 1 : end]
            ]
            found.append(
                Block(
                    path=path,
                    line=i + 1,
                    language=LANGUAGES[lang],
                    marker=marker.group(1) if marker else None,
                    code="\n".join(body) + "\n",
                )
            )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks_of(path)]


def tour_blocks() -> list[Block]:
    return [b for b in blocks_of(ROOT / "README.md") if b.marker == TOUR]


def shell_commands(block: Block) -> str:
    """The shell text of a block (a ``console`` block's ``$ `` lines only)."""
    if "$ " not in block.code or not any(line.startswith("$ ") for line in block.code.splitlines()):
        return block.code
    return "\n".join(line[2:] for line in block.code.splitlines() if line.startswith("$ ")) + "\n"


def syntax_problem(block: Block) -> str | None:
    if block.language == "python":
        try:
            compile(block.code, block.where, "exec")
        except SyntaxError as exc:
            return f"{block.where}: python syntax: {exc}"
        return None
    proc = subprocess.run(
        ["bash", "-n"], input=shell_commands(block), capture_output=True, text=True, timeout=30
    )
    if proc.returncode != 0:
        return f"{block.where}: bash -n: {proc.stderr.strip()}"
    return None


def _shell_tokens(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    tokens: list[str] = []
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens += list(lexer)
        except ValueError:  # an unbalanced quote spanning lines: judge its words anyway
            tokens += line.split()
        tokens.append(";")
    return tokens


def unknown_cli_options(block: Block, parsers: dict[tuple[str, ...], object]) -> list[str]:
    """``--flags`` that the ``quorumlog`` (sub)command they are given to does not know."""
    problems: list[str] = []
    tokens = _shell_tokens(shell_commands(block))
    i = 0
    while i < len(tokens):
        word = tokens[i].lstrip("$(`")
        if word.rsplit("/", 1)[-1] != "quorumlog":
            i += 1
            continue
        path: tuple[str, ...] = ()
        i += 1
        while i < len(tokens) and tokens[i] not in _SHELL_BREAKS:
            token = tokens[i]
            if (*path, token) in parsers and not token.startswith("-"):
                path = (*path, token)
            elif token.startswith("--"):
                parser = parsers[path]
                known = {s for action in parser._actions for s in action.option_strings}  # type: ignore[attr-defined]
                name = token.split("=", 1)[0]
                if name not in known:
                    problems.append(
                        f"{block.where}: `quorumlog {' '.join(path)}` has no option {name}"
                    )
            i += 1
    return problems


def unknown_spark_options(block: Block) -> list[str]:
    from quorumlog.connector.options import OPTION_NAMES, SINK_OPTION_NAMES

    known = set(OPTION_NAMES) | set(SINK_OPTION_NAMES) | SPARK_WRITER_OPTIONS
    names = re.findall(r"\.option\(\s*[\"']([^\"']+)[\"']", block.code)
    for call in re.findall(r"\.options\(([^)]*)\)", block.code):
        names += re.findall(r"(\w+)\s*=", call)
    return [
        f"{block.where}: .option({name!r}) is not an option of format('quorumlog')"
        for name in names
        if name.lower() not in known
    ]


def relative_links(path: Path) -> list[str]:
    """Relative link targets of a Markdown file that name no existing file."""
    text = path.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            broken.append(f"{path.relative_to(ROOT)}: broken link ({target})")
    return broken
