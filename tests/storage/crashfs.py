"""Record what storage does to the disk, and build the states a power loss can leave.

``RecordingFileOps`` is installed as storage's file layer (``storage.fileio``) while a
workload runs: every write, truncate, fsync, create, rename, unlink, mkdir, directory
fsync and syncfs under one root directory is kept, in order, with the bytes written.

``Shadow`` replays that stream as a POSIX file system would hold it: each file's content
as last fsync'd plus the writes since (pending), each directory's entries as last
fsync'd plus the creates, renames and unlinks since. ``Shadow.crash_states`` yields the
file trees a power loss at that point may leave (ALICE's and CrashMonkey's model):

- a file keeps its durable content plus a prefix of its pending writes and truncates,
  the last one kept possibly torn (cut short, or its last 512-byte block garbage);
- a directory keeps its durable entries plus a prefix of its pending operations, or all
  of them but one (entries reach the disk in any order until the directory is fsync'd);
- a file or directory whose entry is gone is gone, whatever its content;
- an fsync makes one file's content durable, a directory fsync that directory's
  entries, a syncfs everything.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from quorumlog.replica.storage.fileio import FileOps

# (kind, ...): see Shadow.apply for each kind's fields.
Op = tuple[Any, ...]
Entry = tuple[str, int]  # ("f", file id) or ("d", 0)
BLOCK = 512


class RecordingFileOps(FileOps):
    """Storage's file layer, recording every change under ``root`` into ``ops``. The
    tree under ``root`` when recording starts is taken as durable (``initial``)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.ops: list[Op] = []
        self._ids: dict[tuple[int, int], int] = {}
        self._fds: dict[int, tuple[int, bool]] = {}  # fd -> (file id, O_APPEND)
        self._next = 0
        self.initial: list[Op] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            for d in sorted(dirnames):
                self.initial.append(("mkdir", dirpath, d))
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                fid = self._new_id(path)
                with open(path, "rb") as fh:
                    data = fh.read()
                self.initial.append(("link", dirpath, name, fid))
                if data:
                    self.initial.append(("write", fid, 0, data))

    def mark(self, label: Any) -> None:
        """A point between two calls of the workload, with what it knew then."""
        self.ops.append(("mark", label))

    # -- helpers -------------------------------------------------------------------------

    def _inside(self, path: str) -> bool:
        path = os.path.abspath(path)
        return path == self.root or path.startswith(self.root + os.sep)

    def _new_id(self, path: str) -> int:
        st = os.stat(path)
        self._next += 1
        self._ids[(st.st_dev, st.st_ino)] = self._next
        return self._next

    def _id_of_fd(self, fd: int) -> tuple[int, bool] | None:
        return self._fds.get(fd)

    def _position(self, fd: int, append: bool) -> int:
        return os.fstat(fd).st_size if append else os.lseek(fd, 0, os.SEEK_CUR)

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        path = os.path.abspath(path)
        return os.path.dirname(path), os.path.basename(path)

    # -- the calls -----------------------------------------------------------------------

    def open_file(self, path: str, flags: int, mode: int = 0o644) -> int:
        existed = os.path.lexists(path)
        size = os.stat(path).st_size if existed else 0
        fd = super().open_file(path, flags, mode)
        if not self._inside(path):
            return fd
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if not existed or key not in self._ids:
            fid = self._new_id(path)
            self.ops.append(("link", *self._split(path), fid))
        else:
            fid = self._ids[key]
            if flags & os.O_TRUNC and size:
                self.ops.append(("truncate", fid, 0))
        self._fds[fd] = (fid, bool(flags & os.O_APPEND))
        return fd

    def close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        super().close(fd)

    def _wrote(self, fd: int, position: int, data: bytes) -> None:
        known = self._id_of_fd(fd)
        if known is not None and data:
            self.ops.append(("write", known[0], position, data))

    def write(self, fd: int, data: bytes | memoryview) -> int:
        known = self._id_of_fd(fd)
        position = self._position(fd, known[1]) if known else 0
        n = super().write(fd, data)
        self._wrote(fd, position, bytes(data[:n]))
        return n

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        n = super().pwrite(fd, data, offset)
        self._wrote(fd, offset, bytes(data[:n]))
        return n

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        known = self._id_of_fd(fd)
        position = self._position(fd, known[1]) if known else 0
        n = super().writev(fd, buffers)
        if known is not None:
            self._wrote(fd, position, b"".join(bytes(b) for b in buffers)[:n])
        return n

    def ftruncate(self, fd: int, length: int) -> None:
        super().ftruncate(fd, length)
        known = self._id_of_fd(fd)
        if known is not None:
            self.ops.append(("truncate", known[0], length))

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        known = self._id_of_fd(fd)
        if known is not None:
            self.ops.append(("fsync", known[0]))

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        known = self._id_of_fd(fd)
        if known is not None:
            self.ops.append(("fsync", known[0]))

    def replace(self, src: str, dst: str) -> None:
        super().replace(src, dst)
        if self._inside(dst):
            self.ops.append(("rename", *self._split(src), *self._split(dst)))

    def unlink(self, path: str) -> None:
        super().unlink(path)
        if self._inside(path):
            self.ops.append(("unlink", *self._split(path)))

    def mkdir(self, path: str) -> None:
        super().mkdir(path)
        if self._inside(path):
            self.ops.append(("mkdir", *self._split(path)))

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        if self._inside(path):
            self.ops.append(("fsync_dir", os.path.abspath(path)))

    def syncfs(self, call: Any, fd: int) -> int:
        result = super().syncfs(call, fd)
        if result == 0:
            self.ops.append(("syncfs",))
        return result


@dataclass
class _File:
    durable: bytes = b""
    pending: list[Op] = field(default_factory=list)
    current: bytearray = field(default_factory=bytearray)


@dataclass
class _Dir:
    durable: dict[str, Entry] = field(default_factory=dict)
    pending: list[Op] = field(default_factory=list)
    current: dict[str, Entry] = field(default_factory=dict)


def _apply_data(content: bytearray, op: Op) -> None:
    if op[0] == "write":
        _, _, position, data = op
        if len(content) < position:
            content.extend(bytes(position - len(content)))
        content[position : position + len(data)] = data
    else:  # truncate
        length = op[2]
        if len(content) > length:
            del content[length:]
        else:
            content.extend(bytes(length - len(content)))


def _apply_entry(entries: dict[str, Entry], op: Op) -> None:
    kind = op[0]
    if kind == "set":
        entries[op[1]] = op[2]
    elif kind == "del":
        entries.pop(op[1], None)
    elif kind == "rename":
        entry = entries.pop(op[1], None)
        if entry is not None:
            entries[op[2]] = entry


class Shadow:
    """The stream replayed: what is durable and what is pending, per file and directory."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.files: dict[int, _File] = {}
        self.dirs: dict[str, _Dir] = {self.root: _Dir()}

    def apply(self, op: Op) -> None:
        kind = op[0]
        if kind == "mark":
            return
        if kind == "link":
            _, directory, name, fid = op
            self.files[fid] = _File()
            self._dir_op(directory, ("set", name, ("f", fid)))
        elif kind == "mkdir":
            _, parent, name = op
            self.dirs[os.path.join(parent, name)] = _Dir()
            self._dir_op(parent, ("set", name, ("d", 0)))
        elif kind in ("write", "truncate"):
            f = self.files[op[1]]
            f.pending.append(op)
            _apply_data(f.current, op)
        elif kind == "fsync":
            f = self.files[op[1]]
            f.durable, f.pending = bytes(f.current), []
        elif kind == "rename":
            _, sdir, sname, ddir, dname = op
            if sdir == ddir:
                self._dir_op(sdir, ("rename", sname, dname))
            else:
                entry = self.dirs[sdir].current[sname]
                self._dir_op(sdir, ("del", sname))
                self._dir_op(ddir, ("set", dname, entry))
        elif kind == "unlink":
            self._dir_op(op[1], ("del", op[2]))
        elif kind == "fsync_dir":
            d = self.dirs[op[1]]
            d.durable, d.pending = dict(d.current), []
        elif kind == "syncfs":
            for f in self.files.values():
                f.durable, f.pending = bytes(f.current), []
            for d in self.dirs.values():
                d.durable, d.pending = dict(d.current), []
        else:
            raise ValueError(f"unknown op {op!r}")

    def _dir_op(self, directory: str, op: Op) -> None:
        d = self.dirs[directory]
        d.pending.append(op)
        _apply_entry(d.current, op)

    def make_durable(self) -> None:
        """Take everything applied so far as durable (the tree before recording)."""
        self.apply(("syncfs",))

    # -- crash states --------------------------------------------------------------------

    def _file_choices(self, fid: int) -> list[tuple[int, str]]:
        """(pending ops kept, how the last kept one is torn: "" / "cut" / "garbage")."""
        f = self.files[fid]
        out: list[tuple[int, str]] = [(n, "") for n in range(len(f.pending) + 1)]
        for n, op in enumerate(f.pending, start=1):
            if op[0] == "write" and len(op[3]) > 1:
                out.append((n, "cut"))
                out.append((n, "garbage"))
        return out

    def _dir_choices(self, path: str) -> list[tuple[int, int]]:
        """(pending ops kept as a prefix, the one among them left out or -1)."""
        n = len(self.dirs[path].pending)
        out = [(k, -1) for k in range(n + 1)]
        out += [(n, skip) for skip in range(n)] if n > 1 else []
        return out

    def crash_states(
        self, rng: random.Random, limit: int
    ) -> Iterator[tuple[str, dict[str, bytes]]]:
        """Up to ``limit`` distinct file trees a power loss now may leave: every pending
        change lost, every one kept, each file and directory varied alone with the rest
        lost and with the rest kept, then random combinations. Yields (digest, tree),
        the tree as {relative path: content}."""
        files = [fid for fid, f in self.files.items() if f.pending]
        dirs = [path for path, d in self.dirs.items() if d.pending]
        fchoices = {fid: self._file_choices(fid) for fid in files}
        dchoices = {path: self._dir_choices(path) for path in dirs}
        none = ({fid: (0, "") for fid in files}, {p: (0, -1) for p in dirs})
        full = (
            {fid: (len(self.files[fid].pending), "") for fid in files},
            {p: (len(self.dirs[p].pending), -1) for p in dirs},
        )
        plans: list[tuple[dict[int, tuple[int, str]], dict[str, tuple[int, int]]]] = [
            none,
            full,
        ]
        for base in (none, full):
            for fid in files:
                for choice in fchoices[fid]:
                    plans.append(({**base[0], fid: choice}, base[1]))
            for p in dirs:
                for dchoice in dchoices[p]:
                    plans.append((base[0], {**base[1], p: dchoice}))
        seen: set[str] = set()
        tried: set[tuple[Any, ...]] = set()
        produced = 0
        attempts = 0
        i = 0
        while produced < limit and attempts < limit * 4 + len(plans):
            attempts += 1
            if i < len(plans):
                fplan, dplan = plans[i]
                i += 1
            else:
                fplan = {fid: rng.choice(fchoices[fid]) for fid in files}
                dplan = {p: rng.choice(dchoices[p]) for p in dirs}
            key = (tuple(sorted(fplan.items())), tuple(sorted(dplan.items())))
            if key in tried and not any(tear for _n, tear in fplan.values()):
                continue
            tried.add(key)
            tree = self._tree(fplan, dplan, rng)
            digest = _digest(tree)
            if digest in seen:
                continue
            seen.add(digest)
            produced += 1
            yield digest, tree

    def _content(self, fid: int, plan: tuple[int, str], rng: random.Random) -> bytes:
        f = self.files[fid]
        kept, tear = plan
        content = bytearray(f.durable)
        for j, op in enumerate(f.pending[:kept]):
            if j == kept - 1 and tear and op[0] == "write":
                _, _, position, data = op
                if tear == "cut":
                    data = data[: rng.randrange(1, len(data))]
                else:
                    start = max(0, len(data) - BLOCK) if len(data) > BLOCK else 0
                    start -= start % BLOCK
                    data = data[:start] + rng.randbytes(len(data) - start)
                op = ("write", fid, position, data)
            _apply_data(content, op)
        return bytes(content)

    def _entries(self, path: str, plan: tuple[int, int] | None) -> dict[str, Entry]:
        d = self.dirs[path]
        if plan is None:
            return dict(d.durable)
        kept, skip = plan
        entries = dict(d.durable)
        for j, op in enumerate(d.pending[:kept]):
            if j != skip:
                _apply_entry(entries, op)
        return entries

    def _tree(
        self,
        fplan: dict[int, tuple[int, str]],
        dplan: dict[str, tuple[int, int]],
        rng: random.Random,
    ) -> dict[str, bytes]:
        tree: dict[str, bytes] = {}
        stack = [self.root]
        while stack:
            path = stack.pop()
            for name, (kind, fid) in sorted(self._entries(path, dplan.get(path)).items()):
                child = path + os.sep + name
                rel = child[len(self.root) + 1 :]
                if kind == "d":
                    tree[rel + os.sep] = b""
                    stack.append(child)
                else:
                    f = self.files[fid]
                    plan = fplan.get(fid, (len(f.pending), ""))
                    tree[rel] = self._content(fid, plan, rng) if f.pending else f.durable
        return tree

    def current_is_durable(self) -> bool:
        return not any(f.pending for f in self.files.values()) and not any(
            d.pending for d in self.dirs.values()
        )


def _digest(tree: dict[str, bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(tree):
        h.update(path.encode() + b"\0" + hashlib.blake2b(tree[path], digest_size=16).digest())
    return h.hexdigest()


def materialize(tree: dict[str, bytes], target: str) -> None:
    """Write ``tree`` under the (empty) directory ``target``."""
    for rel in sorted(tree):
        path = os.path.join(target, rel)
        if rel.endswith(os.sep):
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(tree[rel])
