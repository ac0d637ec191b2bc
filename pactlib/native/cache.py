"""The cache of compiled native libraries: verified before every load, rebuilt when broken.

The libraries live in :func:`pactlib.paths.cache_dir` ``/native``, which must be owned by the
user and writable by nobody else (as ssh refuses such key files): a folder others may write to
could hold code they planted, so :func:`open_folder` refuses it (:class:`UnsafeFolder`) and the
callers run the torch path. Each build ``<stem>-<key>`` is two files:

- ``<stem>-<key>-<sha>.so``: the library, named by the first 16 hex digits of its SHA-256;
- ``<stem>-<key>.sha256``: its whole SHA-256, written (atomically) once the library is complete.

:func:`load` reads the library through one file descriptor, hashes those bytes, compares them with
the record and loads the same descriptor (``/proc/self/fd/N``), so the code loaded is the code
hashed. A library that is missing its record, truncated, changed, replaced or unloadable is never
loaded: it is rebuilt, with one warning saying which file and why. Compiles and records are
written to temporaries named ``.<stem>-<pid>-<random>….tmp`` in the folder, then renamed; the
temporaries of a process that is gone (a killed compile) are removed by the next :func:`load`,
with a warning naming each.

Standard library only.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import secrets
import stat
import warnings
from collections.abc import Callable
from pathlib import Path

from ..paths import cache_dir

__all__ = ["UnsafeFolder", "open_folder", "remove_dead_temps", "build", "load", "mark"]

#: the temporaries this module writes: ``.<stem>-<pid>-<8 hex digits><suffix>.tmp``
TEMP = re.compile(r"\.(?P<stem>[A-Za-z0-9_]+)-(?P<pid>[0-9]+)-[0-9a-f]{8}(\.[a-z0-9]+)?\.tmp")
_DIGEST = re.compile(r"[0-9a-f]{64}")

_held: list[int] = []  # descriptors of loaded libraries: kept open, so their /proc/self/fd names stay unique


class UnsafeFolder(Exception):
    """The cache folder may hold code of another user: owned by another, or writable by its group
    or by other users. The message names the folder and says why."""


def open_folder() -> tuple[Path, int]:
    """The cache folder (created ``0700`` when missing) and a descriptor of it (the caller closes it).

    Raises:
        UnsafeFolder: the folder is not owned by this user, or its group or other users may write to it.
        OSError: it cannot be created or opened.
    """
    path = cache_dir("native")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(fd)
    uid = os.geteuid()
    why = None
    if st.st_uid != uid:
        why = f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "other users"))
                           if st.st_mode & bit)
        why = f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}; chmod go-w it to use native code)"
    if why is not None:
        os.close(fd)
        raise UnsafeFolder(f"native code not used: the cache folder {path} {why}; the torch path runs instead")
    return path, fd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_dead_temps(path: Path, fd: int) -> list[str]:
    """Remove the temporaries (:data:`TEMP`) in the folder ``fd`` (at ``path``) whose process is
    gone, with a warning naming each; returns their names."""
    gone = []
    for name in os.listdir(fd):
        m = TEMP.fullmatch(name)
        if m is None or _alive(int(m["pid"])):
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:  # another run removed it
            continue
        gone.append(name)
        warnings.warn(f"removed {path / name}: the temporary file of a native library build whose process "
                      f"({m['pid']}) is gone", stacklevel=2)
    return gone


def _temp(stem: str, suffix: str) -> str:
    return f".{stem}-{os.getpid()}-{secrets.token_hex(4)}{suffix}.tmp"


def _unlink(fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass


def _write(fd: int, name: str, data: bytes, stem: str) -> None:
    """Write ``name`` in the folder ``fd`` atomically: a temporary (never through a link), then a rename."""
    tmp = _temp(stem, Path(name).suffix)
    f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
    try:
        try:
            os.write(f, data)
        finally:
            os.close(f)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        _unlink(fd, tmp)


def _read_small(fd: int, name: str) -> str | None:
    """The text of the small file ``name`` (not followed through a link), or None when absent or unreadable."""
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    try:
        return os.read(f, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(f)


def _sha256(f: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(f, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def _library_name(stem: str, key: str, digest: str) -> str:
    return f"{stem}-{key}-{digest[:16]}.so"


def build(path: Path, fd: int, stem: str, key: str, compile: Callable[[str], None]) -> tuple[Path, str]:
    """Compile into the folder ``fd`` (at ``path``): ``compile(out)`` writes the library to the
    path ``out`` (a temporary); it is then hashed, renamed to its name, its SHA-256 recorded, and
    the other builds of ``<stem>-<key>`` removed. Returns (the library, its SHA-256).

    Raises:
        OSError: the folder cannot be written; whatever ``compile`` raises (a failed compile).
    """
    tmp = _temp(stem, ".so")
    try:
        compile(str(path / tmp))
        f = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            digest = _sha256(f)
        finally:
            os.close(f)
        name = _library_name(stem, key, digest)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        _unlink(fd, tmp)
    _write(fd, f"{stem}-{key}.sha256", (digest + "\n").encode(), stem)
    for other in os.listdir(fd):  # earlier builds (another digest) and this module's predecessors' file names
        if other != name and other != name + ".agrees" and (
                other.startswith(f"{stem}-{key}-") or other in (f"{stem}-{key}.so", f"{stem}-{key}.so.agrees")):
            _unlink(fd, other)
    return path / name, digest


def _open_verified(path: Path, fd: int, stem: str, key: str) -> tuple[int, str, str] | str | None:
    """(a descriptor of the library of ``<stem>-<key>``, its name, its SHA-256) when its bytes are
    the recorded ones; None when there is no build; else why it may not be loaded (a sentence)."""
    record = _read_small(fd, f"{stem}-{key}.sha256")
    if record is None:
        legacy = f"{stem}-{key}.so"
        return f"{path / legacy}: no SHA-256 was recorded at its build" if legacy in os.listdir(fd) else None
    if not _DIGEST.fullmatch(record):
        return f"{path / f'{stem}-{key}.sha256'}: the record of its SHA-256 is unreadable"
    name = _library_name(stem, key, record)
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError as e:
        return f"{path / name}: it cannot be opened ({e.strerror})"
    try:
        st = os.fstat(f)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "it is not a regular file"
        elif st.st_uid != os.geteuid():
            why = f"it is owned by uid {st.st_uid}, not by this user"
        else:
            got = _sha256(f)
            if got != record:
                why = (f"its SHA-256 ({got[:16]}…, {st.st_size} bytes) is not the one recorded at its build "
                       f"({record[:16]}…)")
    except BaseException:
        os.close(f)
        raise
    if why is not None:
        os.close(f)
        return f"{path / name}: {why}"
    return f, name, record


def _dlopen(f: int, file: Path) -> ctypes.CDLL:
    """Load the library open at ``f`` (these bytes, whatever the name now holds) where the system
    names descriptors, else by its path; the descriptor is kept open (closed on failure)."""
    try:
        lib = ctypes.CDLL(f"/proc/self/fd/{f}" if os.path.isdir("/proc/self/fd") else str(file))
    except BaseException:
        os.close(f)
        raise
    _held.append(f)
    return lib


def load(stem: str, key: str, compile: Callable[[str], None], *, marked_only: bool = False
         ) -> tuple[ctypes.CDLL, Path, str] | None:
    """The library of ``<stem>-<key>`` (a build of the current sources, compiler and CPU), its
    path and SHA-256: built when missing, rebuilt (one warning, naming the file and why) when its
    bytes are not the recorded ones or it cannot be loaded. With ``marked_only``, only a library
    :func:`mark` ed is loaded; a verified one without the mark gives None (a missing or broken one
    is still built).

    Returns None also when the rebuilt library cannot be loaded (a warning says so).

    Raises:
        UnsafeFolder: the cache folder is refused (:func:`open_folder`).
        OSError: the folder cannot be written; whatever ``compile`` raises (a failed compile).
    """
    path, fd = open_folder()
    try:
        remove_dead_temps(path, fd)
        for attempt in range(2):
            found = _open_verified(path, fd, stem, key)
            if isinstance(found, tuple):
                f, name, digest = found
                if marked_only and _read_small(fd, name + ".agrees") != digest:
                    os.close(f)
                    return None
                try:
                    return _dlopen(f, path / name), path / name, digest
                except OSError as e:
                    found = f"{path / name}: it cannot be loaded ({e})"
            if isinstance(found, str):
                if attempt:
                    warnings.warn(f"native code not used: the library just built, {found}", stacklevel=2)
                    return None
                warnings.warn(f"rebuilding the native library {found}", stacklevel=2)
            elif attempt:
                warnings.warn(f"native code not used: the library of {path / stem}-{key} vanished after its build",
                              stacklevel=2)
                return None
            build(path, fd, stem, key, compile)
        return None
    finally:
        os.close(fd)


def mark(file: Path, digest: str) -> None:
    """Record that the library ``file`` (of SHA-256 ``digest``) passed its probe: ``<file>.agrees``
    holds the digest (written atomically)."""
    path, fd = open_folder()
    try:
        _write(fd, file.name + ".agrees", (digest + "\n").encode(), file.name.split("-")[0])
    finally:
        os.close(fd)

