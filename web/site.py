"""What every page of the session browser shares: its settings, the store, templates.

Each request opens its own ``Store`` handle (a handle belongs to one thread,
and Starlette runs each page in a worker thread; opening one costs ~0.3 ms)
and closes it when the page is made, so a page always reads the refs as
they are now and holds no writer lock after it answers.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from agent.control_chars import visible
from objstore import Store

from .guard import Guard

TEMPLATES: Final = Path(__file__).parent / "templates"
STATIC: Final = Path(__file__).parent / "static"
SESSION_RE: Final = re.compile(r"[0-9a-f]{32}")
NODE_RE: Final = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    store_path: Path
    read_only: bool
    guard: Guard


def _one_line(value: Any, default: str = "") -> str:
    """A value from a session for one line of a page: hidden characters visible."""
    if value is None or value == "":
        return default
    return visible(value if isinstance(value, str) else str(value))


def _time(value: Any) -> Markup:
    """A stored time as ``<time>``: the text is UTC to the minute, and app.js turns it
    into '3 minutes ago' in the reader's language."""
    if not isinstance(value, str) or not value:
        return Markup("never")
    shown = value[:16].replace("T", " ") + " UTC" if len(value) >= 16 else value
    return Markup('<time class="ago" datetime="{}">{}</time>').format(value, visible(shown))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["v"] = _one_line
    env.filters["short"] = lambda oid, n=12: oid[:n] if oid else "-"
    env.filters["time"] = _time
    return env


_ENV: Final = _environment()


def config(request: Request) -> ServeConfig:
    value: ServeConfig = request.app.state.config
    return value


def open_store(path: Path) -> Store:
    """A handle on the store the server was started on; never a new store, should that
    one have gone (StoreMissing: the page says so)."""
    return Store.open(path, create=False)


@contextmanager
def store(request: Request) -> Iterator[Store]:
    with open_store(config(request).store_path) as handle:
        yield handle


@dataclass(frozen=True, slots=True)
class ServerPaths:
    """The places on the server's disk an error may name, and what a page says
    instead: the store, the directory the server runs in, the home directory, each
    as given and with links resolved. A bare ``/`` is left out: it is in every path."""

    labels: dict[str, str]
    pattern: re.Pattern[str]

    @classmethod
    def of(cls, store_path: Path) -> ServerPaths:
        labels: dict[str, str] = {}
        for path, label in (
            (Path.home(), "~"),
            (Path(os.getcwd()), "<server directory>"),
            (store_path, "<store>"),  # last: the store wins over a directory it is in
        ):
            for form in (str(path), os.path.realpath(path)):
                if len(form.rstrip("/")) > 1:
                    labels[form.rstrip("/")] = label
        # The longest first, so that a path inside another is named for itself; only
        # where the path ends (a name that merely starts the same is another path).
        alternatives = "|".join(re.escape(p) for p in sorted(labels, key=len, reverse=True))
        pattern = re.compile(f"(?:{alternatives})(?=$|[/\\s'\":;,)\\]])")
        return cls(labels, pattern)

    def hide(self, message: str) -> str:
        return self.pattern.sub(lambda m: self.labels[m.group()], message)


_server_paths: Final = functools.lru_cache(maxsize=4)(ServerPaths.of)


def public_message(request: Request, message: str) -> str:
    """``message`` (an error's text) as a page may show it: without a path of the
    server's disk. The store's errors name files for the person at the command line;
    the session browser may be open to others (``--host``), and where the store and
    the server live is none of their business."""
    return _server_paths(config(request).store_path).hide(message)


def render(request: Request, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    """A page: ``template`` filled with ``values`` and what every page needs."""
    cfg = config(request)
    html = _ENV.get_template(template).render(
        request=request,
        csrf=request.state.csrf,
        read_only=cfg.read_only,
        **{"note": None, **values},
    )
    return HTMLResponse(html, status_code=status_code, headers={"cache-control": "no-store"})
