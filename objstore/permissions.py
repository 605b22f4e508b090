"""Who may change a store: ags opens only a store that no other user can write to.

A store's files steer where ags writes: a lock or reflog file replaced by a
symbolic link would redirect the next append into another file, and sessions
hold conversations and tool output that others must not read. So, as Git's
``safe.directory`` does, ``Store.open`` refuses a store unless the user
running ags owns the store directory and each directory of its layout, and
no other user can write to any of them (``check_store_access``). Files are
also never opened through a symbolic link (files.py).

``AGS_ALLOW_SHARED_STORE=1`` (``Store.open(..., allow_shared=True)``) opens
such a store anyway, for a store shared on purpose; links are still refused,
and a directory of the layout that is a link is refused on every open (a file
opened in it with ``O_NOFOLLOW`` would still be reached through it).

Root is held to the same rule. A root process writing into another user's
store would leave files there that their owner can no longer read or
replace (mode 0600, owned by root), and a link planted by that user would
aim root's writes anywhere on the machine.

What ags creates is private whatever the umask: directories 0700, files
0600. ``access_report`` lists, for fsck, what is looser or not the user's.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from .errors import UnsafeStore

ALLOW_SHARED_ENV: Final = "AGS_ALLOW_SHARED_STORE"
# The directories every store has (or will have): checked on every open.
LAYOUT_DIRS: Final = (
    "", "objects", "objects/pack", "refs", "refs/sessions", "refs/tags", "refs/HEAD",
    "refs/remotes", "logs", "locks", "locks/sessions", "tmp", "cache", "cache/remotes",
)  # fmt: skip
_WRITABLE_BY_OTHERS: Final = stat.S_IWGRP | stat.S_IWOTH
_OPEN_TO_OTHERS: Final = 0o077


def shared_allowed(allow_shared: bool | None) -> bool:
    """The caller's choice, else the environment's (``AGS_ALLOW_SHARED_STORE=1``)."""
    if allow_shared is not None:
        return allow_shared
    return os.environ.get(ALLOW_SHARED_ENV, "").strip().lower() in ("1", "true", "yes")


def user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_store_access(root: Path, *, shared: bool = False) -> None:
    """Raise UnsafeStore if a directory of the store's layout is a symbolic link (the
    store directory itself may be one: a user's choice of where it lives), or, unless
    the store is ``shared`` on purpose, if another user owns or can write to the
    store directory or a directory of its layout."""
    uid = os.geteuid()
    how = f"or set {ALLOW_SHARED_ENV}=1 to use a shared store knowingly"
    base = os.fspath(root)
    for sub in LAYOUT_DIRS:
        path = os.path.join(base, sub) if sub else base  # every open: no Path for each
        try:
            st = os.lstat(path) if sub else os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStore(
                f"refusing the store at {root}: {sub} is a symbolic link, and ags follows "
                "none in a store; put the folder itself there"
            )
        if shared:
            continue
        if st.st_uid != uid:
            raise UnsafeStore(
                f"refusing the store at {root}: {path} belongs to {user_name(st.st_uid)}, "
                f"not to you, {user_name(uid)}; run ags as its owner, {how}"
            )
        if st.st_mode & _WRITABLE_BY_OTHERS:
            raise UnsafeStore(
                f"refusing the store at {root}: other users can write to {path} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); run chmod -R go-rwx {root}, {how}"
            )


@dataclass(frozen=True, slots=True)
class AccessReport:
    """What fsck says about who can reach the store's files."""

    problems: list[tuple[str, str]] = field(default_factory=list)  # (path, what)
    open_to_others: list[str] = field(default_factory=list)  # readable or usable by others


def access_report(root: Path) -> AccessReport:
    """Every symbolic link, file or directory of another owner, or one others can
    write to (problems), and every one others can read (``open_to_others``)."""
    uid = os.geteuid()
    report = AccessReport()
    for dirpath, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = os.path.normpath(os.path.join(dirpath, name))
            if name == "." and dirpath != os.fspath(root):
                continue  # each directory once: as an entry of its parent
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                report.problems.append(
                    (rel, "is a symbolic link; ags never creates one, nor follows one")
                )
                continue
            if st.st_uid != uid:
                report.problems.append((rel, f"belongs to {user_name(st.st_uid)}, not to you"))
            mode = stat.S_IMODE(st.st_mode)
            if mode & _WRITABLE_BY_OTHERS:
                report.problems.append((rel, f"other users can write to it (mode {mode:04o})"))
            elif mode & _OPEN_TO_OTHERS:
                report.open_to_others.append(f"{rel} ({mode:04o})")
    return report
