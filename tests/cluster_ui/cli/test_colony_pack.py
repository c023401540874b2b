"""Packing the code ``colony submit`` uploads: what the ignore files leave out, what is never
packed, the same tree giving the same sha256, and refusals that say what to ignore."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile

import pytest

from cluster_ui.cli import pack


def tree(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def members(archive: pack.Archive) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive.data)) as tar:
        return [member.name + ("/" if member.isdir() else "") for member in tar.getmembers()]


def test_gitignore_and_colonyignore_leave_files_out(tmp_path):
    tree(tmp_path, {
        "train.py": "print('hi')\n",
        ".gitignore": "*.pyc\n/data/\nbuild\n",
        ".colonyignore": "notes/\n!keep.pyc\n",
        "keep.pyc": "", "drop.pyc": "",
        "data/set.bin": "x", "src/data/kept.py": "",  # "/data/" is anchored to the root
        "src/build/out.o": "", "notes/draft.md": "",
    })
    archive = pack.pack(tmp_path)
    assert members(archive) == [".colonyignore", ".gitignore", "keep.pyc", "src/", "src/data/", "src/data/kept.py",
                                "train.py"]
    assert archive.files == 5


def test_nested_ignore_files_apply_below_their_directory_and_the_deepest_wins(tmp_path):
    tree(tmp_path, {
        "logs.txt": "kept: the rule is below",
        "sub/.gitignore": "*.txt\n/only-here.py\n",
        "sub/a.txt": "", "sub/only-here.py": "", "sub/deep/only-here.py": "kept: anchored to sub/",
        "sub/deep/.colonyignore": "!important.txt\n",
        "sub/deep/important.txt": "", "sub/deep/other.txt": "",
    })
    assert members(pack.pack(tmp_path)) == [
        "logs.txt", "sub/", "sub/.gitignore", "sub/deep/", "sub/deep/.colonyignore", "sub/deep/important.txt",
        "sub/deep/only-here.py"]


def test_an_ignored_directory_cannot_have_files_brought_back(tmp_path):
    # git's rule: once a directory is excluded, "!dir/file" does not reach inside it.
    tree(tmp_path, {".gitignore": "cache/\n!cache/keep.txt\n", "cache/keep.txt": "", "a.py": ""})
    assert members(pack.pack(tmp_path)) == [".gitignore", "a.py"]


def test_git_metadata_symlinks_and_special_files_are_never_packed(tmp_path):
    tree(tmp_path, {"train.py": "", ".git/HEAD": "ref: refs/heads/main\n", "lib/.git": "gitdir: ../x\n",
                    "lib/util.py": ""})
    os.symlink("train.py", tmp_path / "link.py")
    os.symlink("/etc", tmp_path / "lib" / "etc")
    os.mkfifo(tmp_path / "pipe")
    archive = pack.pack(tmp_path)
    assert members(archive) == ["lib/", "lib/util.py", "train.py"]
    assert (archive.skipped_links, archive.skipped_special) == (("lib/etc", "link.py"), ("pipe",))


def test_an_ignored_symlink_is_not_reported_as_skipped(tmp_path):
    tree(tmp_path, {".gitignore": "latest\n", "a.py": ""})
    os.symlink("a.py", tmp_path / "latest")
    assert pack.pack(tmp_path).skipped_links == ()


def test_the_same_tree_gives_the_same_archive(tmp_path):
    files = {"train.py": "print(1)\n", "pkg/__init__.py": "", "pkg/model.py": "x = 1\n"}
    first = pack.pack(tree(tmp_path / "a", files))
    os.utime(tmp_path / "a" / "train.py", (1, 1))  # a touched file is the same code
    again = pack.pack(tmp_path / "a")
    elsewhere = pack.pack(tree(tmp_path / "b", dict(reversed(files.items()))))  # created in another order
    assert first.sha256 == again.sha256 == elsewhere.sha256 == hashlib.sha256(first.data).hexdigest()
    (tmp_path / "a" / "train.py").write_text("print(2)\n")
    assert pack.pack(tmp_path / "a").sha256 != first.sha256


def test_the_archive_is_a_plain_gzipped_tar_with_no_owner_or_time(tmp_path):
    tree(tmp_path, {"run.sh": "#!/bin/sh\n", "train.py": "print(1)\n"})
    (tmp_path / "run.sh").chmod(0o755)
    archive = pack.pack(tmp_path)
    assert gzip.decompress(archive.data)  # a single gzip stream, as Content-Type: application/gzip says
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        found = {m.name: (m.isfile(), m.mode, m.mtime, m.uid, m.gid, m.uname) for m in tar.getmembers()}
        assert tar.extractfile("train.py").read() == b"print(1)\n"
    assert found == {"run.sh": (True, 0o755, 0, 0, 0, ""), "train.py": (True, 0o644, 0, 0, 0, "")}
    assert archive.raw_bytes == len("#!/bin/sh\n") + len("print(1)\n")


def test_too_many_files_stops_early_and_names_the_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(pack, "MAX_FILES", 20)
    tree(tmp_path, {"train.py": "", **{f"dataset/images/{i:03}.png": "" for i in range(50)}})
    with pytest.raises(pack.PackError) as refusal:
        pack.pack(tmp_path)
    message = str(refusal.value)
    assert "more than 20 files" in message
    assert "dataset/images/ (" in message  # the deep directory that holds them, not just dataset/
    assert ".colonyignore" in message and "--workdir" in message


def test_too_many_bytes_names_the_biggest_files(tmp_path, monkeypatch):
    monkeypatch.setattr(pack, "MAX_RAW_BYTES", 1000)
    tree(tmp_path, {"a.py": "x", "checkpoints/model.pt": "w" * 1500})
    with pytest.raises(pack.PackError) as refusal:
        pack.pack(tmp_path)
    assert "more than 1000 B" in str(refusal.value) and "checkpoints/model.pt (1.5 KiB)" in str(refusal.value)


def test_an_archive_over_the_upload_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(pack, "MAX_ARCHIVE_BYTES", 2000)
    tree(tmp_path, {"weights.bin": os.urandom(4000).hex(), "a.py": ""})  # random: does not compress away
    with pytest.raises(pack.PackError) as refusal:
        pack.pack(tmp_path)
    assert "compressed" in str(refusal.value) and "weights.bin" in str(refusal.value)


def test_not_a_directory(tmp_path):
    with pytest.raises(pack.PackError, match="is not a directory"):
        pack.pack(tmp_path / "missing")


def test_too_many_directories_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.setattr(pack, "MAX_ENTRIES", 10)  # the server counts directories as entries
    for index in range(12):
        (tmp_path / "runs" / f"{index:02}").mkdir(parents=True)
    with pytest.raises(pack.PackError, match="more than 10 files and directories"):
        pack.pack(tmp_path)
