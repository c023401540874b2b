"""Packing a directory into the gzipped tar that ``colony submit`` uploads as a job's code.

What goes in: every regular file and directory under the root except what ``.gitignore`` and
``.colonyignore`` files exclude (at any level, git's syntax and precedence; in one directory the
``.colonyignore`` lines come last, so they can re-include with ``!``). Never ``.git``, never
symbolic links or special files: those are counted so the user hears about them. The archive is
deterministic (walk order sorted, zero mtimes and owners, modes 644/755, no name in the gzip
header) so an unchanged tree gives the same sha256 and the server stores it once. The bounds are
checked while walking, so a directory holding a data set fails fast and names what to ignore.
No HTTP here: ``submit`` uploads what this returns.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from agents import units

MAX_FILES = 10_000
MAX_ENTRIES = 20_000  # files and directories: the server's count
MAX_RAW_BYTES = 256 * 2**20
MAX_ARCHIVE_BYTES = 32 * 2**20  # what the server takes
IGNORE_FILES = (".gitignore", ".colonyignore")
NEVER = {".git"}  # a directory in a clone, a file in a submodule or worktree
WHAT_TO_DO = ("List what the job does not need in .colonyignore (same syntax as .gitignore), "
              "or give --workdir PATH for code already on the nodes, or --no-code.")


class PackError(Exception):
    """The directory cannot be packed (too big, unreadable): said in words for the user."""


@dataclass(frozen=True)
class Archive:
    data: bytes
    sha256: str
    files: int
    raw_bytes: int
    skipped_links: tuple[str, ...] = ()
    skipped_special: tuple[str, ...] = ()
    file_names: frozenset[str] = frozenset()  # paths inside, "/"-separated


@dataclass
class _Tree:
    """What the walk found: archive members in order, and what it left out."""
    dirs: list[str] = field(default_factory=list)
    files: list[tuple[str, int, bool]] = field(default_factory=list)  # (name, size, executable)
    links: list[str] = field(default_factory=list)
    special: list[str] = field(default_factory=list)
    raw_bytes: int = 0

    def members(self):
        """Directories and files in one name-sorted order (a directory before its contents)."""
        merged = [(name, None, False) for name in self.dirs] + self.files
        return sorted(merged, key=lambda member: member[0].split("/"))


# One ignore file's rules: the directory it sits in ("" or "a/b/") and its compiled patterns.
_Rules = tuple[str, pathspec.GitIgnoreSpec]


def pack(root: str | os.PathLike) -> Archive:
    root = Path(root)
    if not root.is_dir():
        raise PackError(f"{root} is not a directory")
    tree = _walk(root)
    buffer = io.BytesIO()
    raw = 0
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, size, executable in tree.members():
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if size is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            content = _read(root, name)
            raw += len(content)  # the file may have grown since the walk saw it
            if raw > MAX_RAW_BYTES:
                raise PackError(_too_big(root, f"more than {units.format_bytes(MAX_RAW_BYTES)}", tree.files, 1))
            info.size, info.mode = len(content), 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(content))
            if buffer.tell() > MAX_ARCHIVE_BYTES:
                break
    data = buffer.getvalue()
    if len(data) > MAX_ARCHIVE_BYTES:
        raise PackError(_too_big(root, f"more than {units.format_bytes(MAX_ARCHIVE_BYTES)} compressed "
                                       "(the most Colony takes)", tree.files, 1, stopped=False))
    return Archive(data=data, sha256=hashlib.sha256(data).hexdigest(), files=len(tree.files), raw_bytes=raw,
                   skipped_links=tuple(sorted(tree.links)), skipped_special=tuple(sorted(tree.special)),
                   file_names=frozenset(name for name, _, _ in tree.files))


def _walk(root: Path) -> _Tree:
    tree = _Tree()
    pending: list[tuple[str, tuple[_Rules, ...]]] = [("", ())]
    while pending:
        prefix, rules = pending.pop()
        directory = root / prefix if prefix else root
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            raise PackError(f"cannot read {prefix or '.'}: {exc.strerror}. {WHAT_TO_DO}") from None
        rules = rules + _rules_in(directory, prefix, {entry.name for entry in entries})
        subdirectories = []
        for entry in entries:
            name = prefix + entry.name
            if entry.name in NEVER:
                continue
            if entry.is_symlink():
                if not _ignored(name, rules, entry.is_dir()):
                    tree.links.append(name)
                continue
            if entry.is_dir(follow_symlinks=False):
                if not _ignored(name + "/", rules, True):
                    tree.dirs.append(name)
                    subdirectories.append((name + "/", rules))
                    if len(tree.dirs) + len(tree.files) > MAX_ENTRIES:
                        raise PackError(_too_big(root, f"more than {MAX_ENTRIES:,} files and directories",
                                                 tree.files, 0))
                continue
            if _ignored(name, rules, False):
                continue
            status = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(status.st_mode):
                tree.special.append(name)
                continue
            tree.files.append((name, status.st_size, bool(status.st_mode & stat.S_IXUSR)))
            tree.raw_bytes += status.st_size
            if len(tree.files) > MAX_FILES:
                raise PackError(_too_big(root, f"more than {MAX_FILES:,} files", tree.files, 0))
            if tree.raw_bytes > MAX_RAW_BYTES:
                raise PackError(_too_big(root, f"more than {units.format_bytes(MAX_RAW_BYTES)}", tree.files, 1))
        pending.extend(reversed(subdirectories))  # depth first, in name order
    return tree


def _rules_in(directory: Path, prefix: str, names: set[str]) -> tuple[_Rules, ...]:
    lines: list[str] = []
    for ignore_file in IGNORE_FILES:
        if ignore_file in names and (directory / ignore_file).is_file():
            try:
                lines += (directory / ignore_file).read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError as exc:
                raise PackError(f"cannot read {prefix}{ignore_file}: {exc.strerror}") from None
    return ((prefix, pathspec.GitIgnoreSpec.from_lines(lines)),) if lines else ()


def _ignored(name: str, rules: tuple[_Rules, ...], is_dir: bool) -> bool:
    """Git's precedence: the deepest ignore file with a pattern that matches decides."""
    if is_dir and not name.endswith("/"):
        name += "/"  # so that "build/" patterns see a directory
    for prefix, spec in reversed(rules):
        verdict = spec.check_file(name[len(prefix):]).include
        if verdict is not None:
            return verdict
    return False


def _read(root: Path, name: str) -> bytes:
    try:
        return (root / name).read_bytes()
    except OSError as exc:
        raise PackError(f"cannot read {name}: {exc.strerror}. {WHAT_TO_DO}") from None


def _too_big(root: Path, what: str, files: list[tuple[str, int, bool]], measure: int, stopped: bool = True) -> str:
    """The refusal, naming the few directories or files that hold most of it (``measure`` 0:
    by file count, 1: by bytes) so the user knows what to put in .colonyignore."""
    biggest = ", ".join(_describe(name, totals) for name, totals in _heaviest(files, measure))
    counted = " (counting stopped there)" if stopped else ""
    where = f"; most of it is in {biggest}" if biggest else ""
    return f"{root} has {what} to upload{counted}{where}. {WHAT_TO_DO}"


def _heaviest(files: list[tuple[str, int, bool]], measure: int, limit: int = 5):
    totals: dict[str, list[int]] = {}  # "data/" or "model.pt" -> [files, bytes]
    children: dict[str, set[str]] = {}
    for name, size, _ in files:
        parts = name.split("/")
        parent = ""
        for depth in range(len(parts)):
            key = "/".join(parts[:depth + 1]) + ("/" if depth < len(parts) - 1 else "")
            totals.setdefault(key, [0, 0])
            totals[key][0] += 1
            totals[key][1] += size
            children.setdefault(parent, set()).add(key)
            parent = key
    chosen = sorted(children.get("", ()), key=lambda key: -totals[key][measure])[:limit]
    whole = sum(totals[key][measure] for key in children.get("", ()))
    chosen = chosen[:1] + [key for key in chosen[1:] if totals[key][measure] >= 0.05 * whole]  # not the crumbs
    for position, key in enumerate(chosen):
        # Name the deep directory that really holds it ("data/raw/"), not just "data/".
        while key in children:
            inner = max(children[key], key=lambda child: totals[child][measure])
            if totals[inner][measure] < 0.9 * totals[key][measure]:
                break
            key = inner
        chosen[position] = key
    return [(key, totals[key]) for key in chosen]


def _describe(name: str, totals: list[int]) -> str:
    count, size = totals
    if name.endswith("/"):
        return f"{name} ({count:,} file{'s' if count != 1 else ''}, {units.format_bytes(size)})"
    return f"{name} ({units.format_bytes(size)})"
