"""The options ``ags chat`` and ``ags run`` share, as one ``AgentOptions``.

Kept apart from workplace.py, which does the work: defining the commands must
not import the model clients and the Docker SDK, or every ``ags`` command
would pay for them at start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True, slots=True)
class AgentOptions:
    resume: str | None
    continue_latest: bool
    model: str | None
    provider: str
    base_url: str | None
    max_context_tokens: int | None
    max_output_tokens: int | None
    stream_tools: bool | None
    image: str | None
    network: bool
    project: str | None


EMPTY_REFUSED = {
    "model": "give a name",
    "image": "give a name",
    "resume": "give a session, node or tag",
    "base_url": "give an http:// or https:// URL",
}


def agent_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``chat`` and ``run`` share, gathered into one AgentOptions."""
    options = [
        click.option("--resume", metavar="SPEC",
                     help="Continue a session, or fork at a node or tag."),
        click.option("--continue", "continue_latest", is_flag=True,
                     help="Continue the most recent session of this project."),
        click.option("--model", envvar="AGS_MODEL", help="Model name (default: gemma4)."),
        click.option("--provider", type=click.Choice(["ollama", "openai"]), default="ollama",
                     envvar="AGS_PROVIDER", show_default=True, help="Wire format of the server."),
        click.option("--base-url", envvar="AGS_BASE_URL",
                     help="Model server (default: $OLLAMA_HOST or localhost:11434; "
                          "$OPENAI_BASE_URL for openai)."),
        click.option("--max-context-tokens", type=click.IntRange(min=256),
                     help="Context budget; compaction at 80% (default: the model's)."),
        click.option("--max-output-tokens", type=click.IntRange(min=1),
                     envvar="AGS_MAX_OUTPUT_TOKENS",
                     help="Cap on each reply's tokens (default: the server's)."),
        click.option("--stream-tools/--no-stream-tools", default=None,
                     help="Stream requests that offer tools (default: yes, until a server "
                          "shows it cannot)."),
        click.option("--image", envvar="AGS_IMAGE", help="Sandbox image."),
        click.option("--network", is_flag=True, help="Give the sandbox a network."),
        click.option("--project", type=click.Path(file_okay=False),
                     help="Project directory (default: here, checked against the session's)."),
    ]  # fmt: skip

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        names = AgentOptions.__slots__
        # Given as "": refused, not sent on to the engines nor taken for "not given"
        # (an empty --resume started a new session, an empty --base-url the default).
        for name, want in EMPTY_REFUSED.items():
            if kwargs.get(name) == "":
                raise click.BadParameter(want, param_hint=f"--{name.replace('_', '-')}")
        opts = AgentOptions(**{n: kwargs.pop(n) for n in names})
        return command(*args, opts=opts, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
