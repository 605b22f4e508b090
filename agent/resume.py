"""Which session a chat or run works on: a new one, the latest of this project
(--continue), or any spec (--resume), where a node that is not a session's head
starts a fork. And the project-root check that keeps a session's tools
pointed at the directory it was made in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from objstore import InvalidInput, Store, UnknownSpec
from objstore.resolve import project_root


@dataclass(frozen=True, slots=True)
class Choice:
    session: str
    how: str  # "new", "resumed", "forked"
    project: Path


def choose_session(
    store: Store,
    *,
    resume: str | None,
    continue_latest: bool,
    project: str | None,
    model: str | None,
) -> Choice:
    """The session to work on, and the project directory its tools will see.

    ``project`` None means the current directory, checked against the
    session's own root; a project given explicitly overrides that check.
    """
    if resume and continue_latest:
        raise InvalidInput("--resume and --continue exclude each other")
    here = Path(project_root(project))
    if not here.is_dir():
        raise InvalidInput(f"project directory {here} does not exist")
    if continue_latest:
        mine = [s for s in store.sessions() if s.root == str(here)]
        if not mine:
            raise UnknownSpec(f"no session of {here} to continue: start one with ags chat")
        return _checked(store, Choice(mine[0].id, "resumed", here), project)
    if resume:
        target = store.lookup(resume)
        if target.session is not None and store.session(target.session).head == target.node:
            return _checked(store, Choice(target.session, "resumed", here), project)
        source = store.session(target.session) if target.session else None
        if source is not None and source.root and project is None:
            _check_root(source.root, here, source.id)
        return Choice(store.fork(resume), "forked", here)
    return Choice(store.new_session(root=here, model=model), "new", here)


def _checked(store: Store, choice: Choice, project: str | None) -> Choice:
    root = store.session(choice.session).root
    if root and project is None:
        _check_root(root, choice.project, choice.session)
    return choice


def _check_root(root: str, here: Path, session: str) -> None:
    if Path(root) != here:
        raise InvalidInput(
            f"session {session[:12]} was started in {root}, not {here}: run it from there, "
            f"or pass --project DIR to let its tools work on another directory"
        )
