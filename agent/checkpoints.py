"""Workspace checkpoints: putting back the files the agent's own tools changed.

Every ``write_file`` and ``edit_file`` stores the file's content before and
after on its tool result's node (agent/tools.py, FORMAT.md 4.2). Rewinding a
session with its files (``ags rewind S SPEC --files``, ``\\rewind N --files``)
then makes each file those nodes changed hold what it held at SPEC: a file
the agent created is removed, one it deleted or changed comes back
(objstore's ``diff_files`` says which and what).

A file that is not what the agent left there (changed by hand, by a shell
command, replaced by a symlink) is not overwritten: the whole rewind is
refused with the list, and nothing changes, unless forced. Where no file can
be put back even by force (a directory is there, a symlinked directory on
the way leads out of the project, it cannot be read) the rewind is refused
before anything is written, forced or not. A file
that already holds what SPEC wants is left alone, so a rewind that stopped
half-way (a full disk, a kill) can simply be run again. Shell commands are
not recorded, so what they did is not undone.

Every read and write goes through :class:`~agent.confined.ConfinedFS`: no
symlink leads a restore out of the project, and a symlink found where a file
is to be put back is removed, never written through.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from objstore import MAX_OBJECT_BYTES, FileDelta, InvalidInput, Store, diff_files

from .confined import ConfinedError, ConfinedFS, FileTooLarge, OutsideRoot
from .errors import FilesChanged


@dataclass(frozen=True, slots=True)
class Restored:
    """One file a rewind put back: ``"written"`` or ``"removed"``."""

    path: str
    action: str


def rewind_with_files(
    store: Store, session: str, spec: str, *, force: bool = False, fs: ConfinedFS | None = None
) -> tuple[str, list[Restored]]:
    """Rewind ``session`` to ``spec`` and put back the files its tools changed since;
    return the new head and what was put back.

    ``fs`` is the session's project (default: its ``root``, opened here). The
    files are checked, then put back, under the session's writer lock and
    before its head moves: a refusal (FilesChanged) or a bad spec changes
    nothing.
    """
    sid = store.session_id(session)
    restored: list[Restored] = []
    opened: list[ConfinedFS] = []

    def put_back(old: str | None, new: str) -> None:
        deltas = diff_files(store, old, new) if old is not None else []
        if not deltas:
            return  # nothing to put back: no project needed
        project = fs
        if project is None:
            project = open_project(store, sid)
            opened.append(project)
        restored.extend(restore(store, project, deltas, force=force))

    try:
        node = store.rewind(sid, spec, before_move=put_back)
    finally:
        for project in opened:
            project.close()
    return node, restored


def open_project(store: Store, sid: str) -> ConfinedFS:
    """The project root the session was made in, opened for restoring files."""
    root = store.session(sid).root
    if root is None:
        raise InvalidInput(f"session {sid} has no project root: its files cannot be put back")
    try:
        return ConfinedFS(Path(root))
    except OSError as exc:
        raise InvalidInput(
            f"cannot open the project root {root} of session {sid}: {exc.strerror or exc}"
        ) from None


def restore(
    store: Store, fs: ConfinedFS, deltas: list[FileDelta], *, force: bool = False
) -> list[Restored]:
    """Make each file of ``deltas`` hold its ``b`` content, where it holds its ``a``
    (what the agent left). FilesChanged, before anything is written, lists the
    files that hold something else, unless ``force``."""
    todo: list[tuple[FileDelta, bytes | None]] = []
    changed: list[tuple[str, str]] = []
    blocked: list[tuple[str, str]] = []
    for delta in deltas:
        want = None if delta.b is None else store.file_bytes(delta.b)
        now, why = _current(fs, delta.path)
        if why is None and now == want:
            continue  # already put back
        expected = None if delta.a is None else store.file_bytes(delta.a)
        if why is None and now == expected:
            todo.append((delta, want))
            continue
        if why in _BLOCKING or (why is not None and why.startswith(_UNREADABLE)):
            blocked.append((delta.path, why))
        changed.append((delta.path, why or _difference(expected, now)))
        todo.append((delta, want))
    if blocked:  # not even --force writes there: refused before anything is written
        shown = "; ".join(f"{path} ({why})" for path, why in blocked[:10])
        raise InvalidInput(f"cannot put back {len(blocked)} file(s): {shown}; nothing was changed")
    if changed and not force:
        raise FilesChanged(changed)
    done = []
    for delta, want in todo:
        done.append(_put(fs, delta.path, want))
    return done


_DIRECTORY = "a directory is there now"
_LEADS_OUT = "a symlink on its way leads out of the project"
_UNREADABLE = "it cannot be read"
_BLOCKING = frozenset({_DIRECTORY, _LEADS_OUT})  # a file cannot be put there, forced or not


def _current(fs: ConfinedFS, path: str) -> tuple[bytes | None, str | None]:
    """What is at ``path`` now: (its bytes or None for nothing, None), or (None, why
    it is not a regular file the agent could have left)."""
    try:
        kind = fs.kind(path, follow_last=False)
        if kind is None:
            return None, None
        if kind == "link":
            return None, "a symlink is there now"
        if kind == "dir":
            return None, _DIRECTORY
        if kind != "file":
            return None, "a special file is there now"
        return fs.read_bytes(path, MAX_OBJECT_BYTES), None
    except FileTooLarge:
        return None, "it is bigger than any content the agent wrote"
    except OutsideRoot:
        return None, _LEADS_OUT
    except (ConfinedError, OSError) as exc:
        return None, f"{_UNREADABLE}: {exc}"


def _difference(expected: bytes | None, now: bytes | None) -> str:
    if now is None:
        return "it was deleted"
    if expected is None:
        return "it was made after the agent removed it"
    return "its content changed"


def _put(fs: ConfinedFS, path: str, want: bytes | None) -> Restored:
    """Write ``want`` at ``path`` (None: remove what is there). A symlink or special
    file there is removed first, not followed (``restore`` refused a directory)."""
    kind = fs.kind(path, follow_last=False)
    if kind is not None and (want is None or kind != "file"):
        fs.remove(path)
    if want is None:
        return Restored(path, "removed")
    fs.write_bytes(path, want, make_parents=True)
    return Restored(path, "written")
