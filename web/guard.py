"""What every request passes before a page sees it, and what every response carries.

The session browser shows everything a store holds and can change it, so a
request must come from the person who started ``ags serve``:

* **Host header** (DNS rebinding): a page on ``evil.example`` whose name is
  made to resolve to 127.0.0.1 reaches this server with ``Host:
  evil.example``. Only the names this server answers to are let in: the
  loopback names on its port, and the ``--host`` it was given. Bound to every
  address (``0.0.0.0``, ``::``), any name is let in, and the token below does
  the job.
* **Token** (off loopback, or with ``--token``): a random secret printed at
  start. The first visit brings it in the URL (``/?token=...``); it goes into
  an HttpOnly, SameSite=Strict cookie and the URL is cleaned by a redirect.
  Every request needs it after that, reads included.
* **Read-only** (``--read-only``): every state-changing request is refused
  here, whatever the page.
* **Anti-CSRF** on every state-changing request (any method but GET and HEAD;
  the pages send URL-encoded forms, read here once): the form carries
  ``HMAC(server secret, csrf cookie)``, which a page of another origin can
  neither read nor make, even one on another port of 127.0.0.1 that can set
  cookies for this host (cookies do not tell ports apart); a browser's
  ``Origin``, when sent, must be this server's; ``Sec-Fetch-Site``, when sent,
  must say same-origin.
* **Response headers**: a Content-Security-Policy with no inline script or
  style and nothing from another origin (a second line behind the sanitiser
  of agent/markup.py), no framing, no sniffing, no referrer to another site.

Comparisons of secrets take constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Final
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", ""})
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SAFE_METHODS: Final = frozenset({"GET", "HEAD"})
MAX_FORM_BYTES: Final = 64 * 1024  # a title, a tag name, a node id: far less
_SECURITY_HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # "no-referrer" makes a form's Origin "null"
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


def is_loopback(host: str) -> bool:
    """Whether ``--host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    bare = host.strip("[]").lower()
    return bare in ("localhost", "::1") or bare.startswith("127.")


def needs_token(host: str, asked: bool) -> bool:
    """Whether a server on ``host`` asks for the token: off loopback always."""
    return asked or not is_loopback(host)


def _host_name(host: str) -> str:
    """``host`` as it appears in a Host header (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host.lower()


@dataclass(frozen=True, slots=True)
class Guard:
    """The checks of one server: where it listens and the secrets it made at start."""

    host: str
    port: int
    token: str | None  # None: no token asked (loopback without --token)
    read_only: bool = False  # every state-changing request is refused
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @property
    def token_cookie(self) -> str:
        return f"ags_token_{self.port}"  # cookies do not tell ports apart; names do

    @property
    def csrf_cookie(self) -> str:
        return f"ags_csrf_{self.port}"

    def first_url(self) -> str:
        """The address to open first: with the token, when one is asked."""
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        query = f"?token={self.token}" if self.token else ""
        return f"http://{_host_name(host)}:{self.port}/{query}"

    def allowed_host(self, value: str) -> bool:
        if self.host in WILDCARD_HOSTS:
            return bool(value)
        names = {f"{name}:{self.port}" for name in LOOPBACK_NAMES}
        names.add(f"{_host_name(self.host)}:{self.port}")
        return value.lower() in names

    def csrf_token(self, cookie: str) -> str:
        """What the forms of a page carry for the browser whose csrf cookie is ``cookie``."""
        return hmac.new(self.secret, cookie.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, cookie: str | None, sent: str | None) -> bool:
        if not cookie or not sent:
            return False
        return hmac.compare_digest(self.csrf_token(cookie), sent)

    def token_ok(self, sent: str | None) -> bool:
        return self.token is None or (
            sent is not None and hmac.compare_digest(sent.encode(), self.token.encode())
        )


def _cookies(headers: Headers) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for value in headers.getlist("cookie"):
        try:
            jar.load(value)
        except Exception:  # a malformed cookie header is no cookie, not an error page
            continue
    return {k: m.value for k, m in jar.items()}


def _set_cookie(name: str, value: str) -> tuple[bytes, bytes]:
    return (b"set-cookie", f"{name}={value}; Path=/; HttpOnly; SameSite=Strict".encode())


class GuardMiddleware:
    """The ASGI middleware that applies a ``Guard`` to every HTTP request."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard = self.guard
        headers = Headers(scope=scope)
        cookies = _cookies(headers)
        refusal = self._refusal(scope, headers, cookies)
        if refusal is not None:
            await _with_headers(refusal, [])(scope, receive, send)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if guard.token is not None and "token" in query and guard.token_ok(query["token"]):
            # The first visit: keep the token in a cookie and take it out of the URL.
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            # A path of "//host" would send the browser to another site: one slash.
            target = "/" + scope["path"].lstrip("/") + (f"?{rest}" if rest else "")
            redirect = RedirectResponse(target, status_code=303)
            await _with_headers(redirect, [_set_cookie(guard.token_cookie, guard.token)])(
                scope, receive, send
            )
            return
        extra = []
        csrf = cookies.get(guard.csrf_cookie)
        if not csrf:
            csrf = secrets.token_hex(16)
            extra.append(_set_cookie(guard.csrf_cookie, csrf))
        state = scope.setdefault("state", {})
        state["csrf"] = guard.csrf_token(csrf)
        if scope["method"] not in SAFE_METHODS:
            form = await _read_form(headers, receive)
            if form is None or not guard.csrf_ok(cookies.get(guard.csrf_cookie), form.get("csrf")):
                response = PlainTextResponse(
                    "ags serve: this form is out of date or from another site: "
                    "reload the page and try again\n",
                    status_code=403,
                )
                await _with_headers(response, extra)(scope, receive, send)
                return
            state["form"] = form

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS, *extra]
            await send(message)

        await self.app(scope, receive, send_guarded)

    def _refusal(self, scope: Scope, headers: Headers, cookies: dict[str, str]) -> Response | None:
        """Why this request may not go further, as the response that says so; or None."""
        guard = self.guard
        if not guard.allowed_host(headers.get("host", "")):
            return PlainTextResponse(
                "ags serve: this server does not answer to that host name\n", status_code=421
            )
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if not guard.token_ok(cookies.get(guard.token_cookie)) and not (
            "token" in query and guard.token_ok(query["token"])
        ):
            return PlainTextResponse(
                "ags serve: this server needs its token: open the address `ags serve` "
                "printed, with ?token=...\n",
                status_code=403,
            )
        if scope["method"] in SAFE_METHODS:
            return None
        if guard.read_only:
            return PlainTextResponse(
                "ags serve: this server is read-only (ags serve --read-only)\n", status_code=403
            )
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{headers.get('host', '').lower()}":
            return PlainTextResponse("ags serve: a request from another site\n", status_code=403)
        fetch_site = headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site not in ("same-origin", "none"):
            return PlainTextResponse("ags serve: a request from another site\n", status_code=403)
        return None  # the form's csrf field is checked once the body is read


async def _read_form(headers: Headers, receive: Receive) -> dict[str, str] | None:
    """The fields of a URL-encoded form body of at most MAX_FORM_BYTES; None otherwise.
    Every state-changing request of the browser is such a form."""
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return None
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > MAX_FORM_BYTES:
            return None
        if not message.get("more_body", False):
            break
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20))
    except ValueError:  # not UTF-8, or too many fields
        return None


def _with_headers(response: Response, extra: list[tuple[bytes, bytes]]) -> ASGIApp:
    response.raw_headers = [*response.raw_headers, *_SECURITY_HEADERS, *extra]
    return response
