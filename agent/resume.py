"""Which session a chat or run works on: a new one, the latest of this project
(--continue), or any spec (--resume), where a node that is not a session's head
starts a fork. And the project-root check that keeps a session's tools
pointed at the directory it was made in.

Choosing writes nothing: a new session, or a fork, is made by ``Choice.create``
when the agent first appends to it, so a run that fails before the model
answers leaves no session behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from objstore import InvalidInput, Store, UnknownSpec, project_root


@dataclass(frozen=True, slots=True)
class Choice:
    session: str | None  # None until ``create`` makes it (how "new" or "forked")
    how: str  # "new", "resumed", "forked"
    project: Path
    fork_spec: str | None = None  # forked: the spec as the user gave it
    base: str | None = None  # forked: the node it named when chosen

    def create(self, store: Store, model: str | None) -> str:
        """Make the new session or the fork this choice stands for; return its id."""
        if self.how == "forked":
            assert self.fork_spec is not None and self.base is not None
            # The spec as given records the session it came through; if that spec
            # has moved since it was chosen, the node it named is forked instead.
            same = store.target(self.fork_spec).node == self.base
            return store.fork(self.fork_spec if same else self.base)
        return store.new_session(root=self.project, model=model)


def choose_session(
    store: Store,
    *,
    resume: str | None,
    continue_latest: bool,
    project: str | None,
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
        target = store.target(resume)
        if target.session is not None and store.session(target.session).head == target.node:
            return _checked(store, Choice(target.session, "resumed", here), project)
        source = store.session(target.session) if target.session else None
        if source is not None and source.root and project is None:
            _check_root(source.root, here, source.id)
        return Choice(None, "forked", here, fork_spec=resume, base=target.node)
    return Choice(None, "new", here)


def _checked(store: Store, choice: Choice, project: str | None) -> Choice:
    assert choice.session is not None
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
