"""The session browser as one ASGI application, and the server that runs it.

``create_app`` puts the pages (pages.py), the changes (actions.py), the live
updates (live.py) and the files in static/ behind the guard (guard.py);
``bind`` takes the port first (so that the address printed is the real one,
port 0 included) and ``serve`` runs the app on it under uvicorn until
interrupted.
"""

from __future__ import annotations

import socket
from types import FrameType
from typing import Final

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from agent.transcript import transcript_css
from objstore import AgsError, UnknownSpec

from . import actions, live, pages
from .guard import GuardMiddleware
from .site import STATIC, ServeConfig, public_message, render

_TRANSCRIPT_CSS: Final = transcript_css().encode()


def _transcript_css(request: Request) -> Response:
    return Response(
        _TRANSCRIPT_CSS, media_type="text/css", headers={"cache-control": "max-age=3600"}
    )


def _store_error(request: Request, exc: Exception) -> Response:
    """An ``AgsError`` (a bad spec, a title too long, a tag that exists...) as a page
    that says it in one line, without the server's paths; 404 for something that
    does not exist."""
    status = 404 if isinstance(exc, UnknownSpec) else 400
    return render(
        request, "error.html", status_code=status, message=public_message(request, str(exc))
    )


def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = "No such page." if status == 404 else f"HTTP {status}"
    return render(request, "error.html", status_code=status, message=message)


def create_app(config: ServeConfig, watchers: live.Watchers | None = None) -> ASGIApp:
    app = Starlette(
        routes=[
            *pages.ROUTES,
            *actions.ROUTES,
            *live.ROUTES,
            Route("/static/transcript.css", _transcript_css),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        exception_handlers={AgsError: _store_error, HTTPException: _http_error},
    )
    app.state.config = config
    app.state.watchers = watchers or live.Watchers(config.store_path)
    return GuardMiddleware(app, config.guard)


class ServeError(AgsError):
    """The server cannot start (the port is taken, the address is not this machine's)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: any free port), or ServeError."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host} port {port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, which also ends the live streams when told to stop (uvicorn
    waits for open responses, then cancels them: a traceback each)."""

    def __init__(self, config: uvicorn.Config, watchers: live.Watchers) -> None:
        super().__init__(config)
        self.watchers = watchers

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.watchers.close_soon()
        super().handle_exit(sig, frame)


def serve(config: ServeConfig, sock: socket.socket) -> None:
    """Run the server on ``sock`` (from ``bind``) until interrupted."""
    watchers = live.Watchers(config.store_path)
    server = _Server(
        uvicorn.Config(
            create_app(config, watchers),
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=1,
            lifespan="off",
        ),
        watchers,
    )
    server.run(sockets=[sock])
