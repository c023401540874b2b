"""``colony submit job.sh``: batch scripts, as ``sbatch job.sh`` takes them.

A script is the first word of the command when it names a local file that starts with a shebang
or ends in ``.sh`` and lies in the directory being uploaded (one elsewhere, or with ``--workdir``
or ``--no-code``, is a program on the nodes, run as given, unless it has ``#COLONY`` lines: then
the job could not get it, which is refused). Its ``#COLONY`` lines carry ``colony submit`` flags
(``#COLONY --gpus 2 --time 2h``), read from the top as sbatch reads ``#SBATCH``: after the
shebang, through blank lines and comments, up to the first other line. Flags given on the command
line win over the script's (``--env`` per variable). The script travels with the code upload (it
must lie in the uploaded directory) and runs as
``<interpreter from its shebang, else bash> <its path there> [args]``.

Nothing here talks HTTP or submits: :func:`apply` only rewrites the parsed arguments, and every
problem is a :class:`Usage` naming the line, so a bad script submits nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from cluster_ui.cli.client import Usage

DIRECTIVE = "#COLONY"
MAX_SCRIPT_BYTES = 1024 * 1024  # a script, not a data file someone named .sh
DEFAULT_INTERPRETER = ("bash",)
# Where the code comes from decides where the script is, so these stay on the command line.
COMMAND_LINE_ONLY = ("--code", "--workdir", "--no-code")


@dataclass(frozen=True)
class Directive:
    line: int  # 1-based, as an editor shows it
    words: tuple[str, ...]


@dataclass(frozen=True)
class BatchScript:
    path: Path
    interpreter: tuple[str, ...]
    directives: tuple[Directive, ...]
    ignored_lines: tuple[int, ...] = ()  # #COLONY lines after the first command: sbatch ignores them too


class _Refusal(Exception):
    """argparse's complaint about one #COLONY line, caught to name the line."""


class _DirectiveParser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refusal(message)


def is_script(word: str, code_dir: str) -> Path | None:
    """The local file ``word`` names when it is a batch script (see the module), else None.
    Looked up as the job would (in the uploaded directory), then from here."""
    for base in (Path(code_dir), Path(os.curdir)):
        candidate = base / word
        if candidate.is_file() and (word.endswith(".sh") or _has_shebang(candidate)):
            return candidate
    return None


def _has_shebang(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def read(path: Path) -> BatchScript:
    """The script's interpreter and ``#COLONY`` lines; a script that cannot be read is a Usage."""
    try:
        if path.stat().st_size > MAX_SCRIPT_BYTES:
            raise Usage(f"{path} is over {MAX_SCRIPT_BYTES // 1024} KiB: not a batch script")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise Usage(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise Usage(f"{path} is not a text file (UTF-8), so not a batch script") from None
    lines = text.splitlines()
    interpreter = DEFAULT_INTERPRETER
    start = 0
    if lines and lines[0].startswith("#!"):
        interpreter = _interpreter(path, lines[0])
        start = 1
    directives, ignored, reading = [], [], True
    for number, line in enumerate(lines[start:], start=start + 1):
        if _is_directive(line):
            if reading:
                directives.append(Directive(number, _words(path, number, line[len(DIRECTIVE):])))
            else:
                ignored.append(number)
        elif reading and line.strip() and not line.lstrip().startswith("#"):
            reading = False
    return BatchScript(path, interpreter, tuple(directives), tuple(ignored))


def _is_directive(line: str) -> bool:
    return line.startswith(DIRECTIVE) and (len(line) == len(DIRECTIVE) or line[len(DIRECTIVE)].isspace())


def _interpreter(path: Path, shebang: str) -> tuple[str, ...]:
    """As the kernel reads a shebang: the program, then the rest of the line as one argument."""
    program, _, argument = shebang[2:].strip().partition(" ")
    if not program:
        raise Usage(f"{path}:1: the shebang names no interpreter (e.g. #!/bin/bash)")
    return (program, argument.strip()) if argument.strip() else (program,)


def _words(path: Path, number: int, text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(_without_comment(text)))
    except ValueError as exc:  # an unclosed quote
        raise Usage(f"{path}:{number}: bad #COLONY line: {exc}") from None


def _without_comment(text: str) -> str:
    """``text`` up to a ``#`` that starts a word outside quotes, as the shell reads comments
    (``--name run#3`` keeps its ``#``; ``--gpus 2  # two`` loses the comment)."""
    quote, previous = None, " "
    for position, char in enumerate(text):
        if quote:
            if char == quote and not (quote == '"' and previous == "\\"):
                quote = None
        elif char in "'\"" and previous != "\\":
            quote = char
        elif char == "#" and previous.isspace():
            return text[:position]
        previous = char
    return text


def directive_values(script: BatchScript, add_arguments, check) -> dict:
    """The flags the ``#COLONY`` lines set, later lines over earlier ones (``--env`` and other
    repeatable flags add up), as ``{dest: value}``. ``add_arguments`` builds ``colony submit``'s
    flags; ``check(namespace)`` validates one line's values (raising Usage), so an error names its line."""
    parser = _DirectiveParser(prog="#COLONY", add_help=False)
    add_arguments(parser)
    defaults = _DirectiveParser(add_help=False)
    add_arguments(defaults)
    blank = defaults.parse_args([])
    values: dict = {}
    for directive in script.directives:
        where = f"{script.path}:{directive.line}"
        for word in directive.words:
            if word.split("=", 1)[0] in COMMAND_LINE_ONLY:
                raise Usage(f"{where}: {word.split('=', 1)[0]} belongs on the command line, not in the script "
                            "(the script is uploaded with the code)")
        try:
            parsed = vars(parser.parse_args(list(directive.words)))
        except _Refusal as exc:
            raise Usage(f"{where}: bad #COLONY line: {exc}") from None
        # A flag with a default of its own comes back on every line: only what the line changed counts.
        given = {dest: value for dest, value in parsed.items() if value != getattr(blank, dest, None)}
        stray = given.pop("command", None)
        if stray:
            raise Usage(f"{where}: #COLONY lines take flags only, e.g. #COLONY --gpus 2 (got {shlex.join(stray)!r})")
        try:
            check(argparse.Namespace(**{**vars(blank), **given, "command": ["-"]}))
        except Usage as exc:
            raise Usage(f"{where}: bad #COLONY line: {exc}") from None
        for dest, value in given.items():
            values[dest] = values.get(dest, []) + value if isinstance(value, list) else value
    return values


def apply(args, script: BatchScript, add_arguments, check, code_dir: str) -> None:
    """Rewrite ``args`` (parsed ``colony submit`` flags) for the script: its ``#COLONY`` values
    where the command line left the flag unset, and the command that runs it in the job."""
    from_script = directive_values(script, add_arguments, check)
    defaults = _DirectiveParser(add_help=False)
    add_arguments(defaults)
    for dest, value in from_script.items():
        if dest == "env" and args.env:
            args.env = _env_merged(value, args.env)
        elif getattr(args, dest, None) == defaults.get_default(dest):
            setattr(args, dest, value)
    if not getattr(args, "name", None):
        args.name = script.path.name
    args.command = [*script.interpreter, _path_in_upload(script.path, code_dir), *args.command[1:]]
    for line in script.ignored_lines:
        print(f"colony: {script.path}:{line}: #COLONY after the script's first command is ignored "
              "(as sbatch does): move it up", file=sys.stderr)


def _env_merged(from_script: list[str], from_command_line: list[str]) -> list[str]:
    """NAME=VALUE lists, one per name, the command line's value where both set one."""
    named = {item.partition("=")[0]: item for item in from_script}
    for item in from_command_line:
        named[item.partition("=")[0]] = item
    return list(named.values())


def inside(path: Path, code_dir: str) -> bool:
    """Whether the upload of ``code_dir`` would hold ``path`` (ignore rules aside)."""
    # Not resolved: the upload takes no symbolic link, so the path as given is the one it has.
    root, where = Path(os.path.abspath(code_dir)), Path(os.path.abspath(path))
    return where != root and where.is_relative_to(root)


def _path_in_upload(path: Path, code_dir: str) -> str:
    """The script's path in the job's working directory (the unpacked upload of ``code_dir``)."""
    if not inside(path, code_dir):
        raise Usage(f"{path} is outside the directory being uploaded ({code_dir}), so the job would not have it")
    return Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(code_dir))).as_posix()
