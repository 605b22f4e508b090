"""What sets an agent to work for ``ags chat`` and ``ags run``: the workplace
(store, model client, sandbox, tools) with the agent on the session chosen,
which a chat may change (``\\resume``). Imported only by those commands: the
model clients and the Docker SDK take most of a second to import."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import click

from agent.errors import ModelError, ModelUnavailable
from agent.loop import Agent, AgentEvents
from agent.models import ModelClient, make_client
from agent.resume import Choice, choose_session
from agent.sandbox import Sandbox
from agent.tools import Toolbox
from objstore import InvalidInput, Store, UnknownSpec, project_root

from .agent_options import AgentOptions
from .app import open_store
from .output import one_line, short


class ProjectEvents(AgentEvents):
    """Events that show what a tool would do to the project (the approval
    previews), told the project's root once it is known."""

    project: Path


class Workplace:
    """What a chat keeps while its session may change (``\\resume``): the store,
    the model client, the sandbox over the project and the tools; and the
    agent working on the session now, which holds that session's writer lock."""

    def __init__(
        self,
        store: Store,
        client: ModelClient,
        toolbox: Toolbox,
        events: AgentEvents,
        opts: AgentOptions,
        choice: Choice,
    ) -> None:
        self.store = store
        self.client = client
        self.toolbox = toolbox
        self.events = events
        self.opts = opts
        self.choice = choice
        self.agent = self._open(choice)

    def _open(self, choice: Choice) -> Agent:
        """An agent on ``choice``: its writer lock taken, its budget checked, its
        unanswered tool calls recovered, and checked out for the project."""
        store, client, events = self.store, self.client, self.events

        def create() -> str:
            sid = choice.create(store, client.model)
            store.checkout(sid, root=choice.project)
            if choice.how == "forked":
                events.notice(f"forked into new session {sid}")
            return sid

        agent = Agent(
            store, choice.session, client, self.toolbox, events, base=choice.base, create=create
        )  # the writer lock
        try:
            agent.max_context_tokens = self.opts.max_context_tokens or _model_context(client)
            agent.check_budget(
                "--max-context-tokens" if self.opts.max_context_tokens else "the model's window"
            )
            agent.recover()
            sid = choice.session
            if sid is not None and _head_session(store, choice.project) != sid:
                store.checkout(sid, root=choice.project)
        except BaseException:
            agent.close()
            raise
        return agent

    def switch(self, spec: str) -> str:
        """Work on the session (or a fork at the node) ``spec`` names from now on.
        It must belong to this project: the sandbox is this project's. The
        current session is let go only once the new one is ready."""
        choice = choose_session(
            self.store, resume=spec, continue_latest=False, project=self.opts.project
        )
        if choice.session is not None and choice.session == self.agent.sid:
            raise InvalidInput(f"already in session {short(choice.session)}")
        agent = self._open(choice)
        self.agent.close()
        self.agent, self.choice = agent, choice
        return self.describe()

    def describe(self) -> str:
        """The session worked on, in words: 'session 3f2a... (resumed, 12 messages)'."""
        choice = self.choice
        if choice.session is None:
            fork = f"a fork of {one_line(choice.fork_spec)}"
            what = "a new session" if choice.how == "new" else fork
            return f"{what} (saved from the first answer on)"
        info = self.store.session(choice.session)
        return f"session {short(info.id)} ({choice.how}, {info.messages} messages)"

    def close(self) -> None:
        self.agent.close()


@contextmanager
def running_agent(
    ctx: click.Context, opts: AgentOptions, events: AgentEvents
) -> Iterator[Workplace]:
    """A fresh sandbox, the session chosen with its writer lock held, unanswered
    tool calls recovered; everything let go on the way out. A session to resume
    is chosen first (a spec that names none is said before the sandbox starts);
    then the client and the sandbox: with a bad model setting or no Docker
    engine, nothing is written, not even a new store; a new session or a fork is
    written with the first answer."""
    project = Path(project_root(opts.project))
    choice = None
    if opts.resume or opts.continue_latest:  # a store to resume from exists already
        choice = _chosen(open_store(ctx, create=False), opts)
    client = make_client(
        opts.provider,
        opts.base_url,
        opts.model,
        max_output_tokens=opts.max_output_tokens,
        stream_tools=opts.stream_tools,
    )
    with closing(client), Sandbox.start(project, opts.image, opts.network) as sandbox:
        store = open_store(ctx)  # only now: a bad setting must not even make a store
        if choice is None:
            choice = _chosen(store, opts)
        toolbox = Toolbox(choice.project, sandbox, {})
        if isinstance(events, ProjectEvents):
            events.project = toolbox.root
        place = Workplace(store, client, toolbox, events, opts, choice)
        try:
            yield place
        finally:
            place.close()


def _chosen(store: Store, opts: AgentOptions) -> Choice:
    return choose_session(
        store, resume=opts.resume, continue_latest=opts.continue_latest, project=opts.project
    )


def _head_session(store: Store, project: Path) -> str | None:
    """The session HEAD names for ``project``, if any. A HEAD naming a session since
    deleted names none: the new checkout replaces it, and it must not stop a chat."""
    try:
        head = store.head(project)
    except UnknownSpec:
        return None
    return head.session if head else None


def _model_context(client: ModelClient) -> int | None:
    try:
        length = client.context_length()
    except ModelUnavailable:
        raise  # no server: say so now, not after the chat call's retries too
    except ModelError:
        return None  # the first chat call will say what is wrong, more precisely
    return int(length) if length else None
