"""The errors of the agent: model servers, the loop, the sandbox, the file tools,
the importers. Each is an ``AgsError`` (objstore/errors.py has the store's), so
the command line prints any of them as one line; a caller that wants to react
(compact on ``ContextTooLong``, stop on ``AuthFailed``) catches the subclass.
Messages say what went wrong, where, and what to do about it; they never carry
an API key::

    AgsError (objstore.errors)
    ├── ModelError                 no reply from a model server
    │   ├── ModelConfigError       the client is set up wrongly
    │   ├── ModelNotFound
    │   ├── ContextTooLong         the conversation does not fit the window: the
    │   │                          server said so, or compaction cannot make it fit
    │   ├── AuthFailed
    │   ├── ModelRequestFailed
    │   ├── ModelUnavailable
    │   └── ModelProtocolError
    ├── SandboxError               the Docker sandbox
    │   ├── DockerUnavailable
    │   └── ImageMissing
    ├── ConfinedError              a file tool refused a path
    │   ├── OutsideRoot
    │   ├── InvalidPath
    │   ├── NotRegularFile
    │   └── FileTooLarge
    ├── FilesChanged               rewind --files met files changed since the agent wrote them
    └── SourceError                another agent's session file cannot be imported
"""

from __future__ import annotations

from objstore import AgsError


def one_line(text: str, limit: int = 300) -> str:
    """``text`` squeezed onto one line and cut to ``limit`` characters.

    Server messages are quoted into ours; a multi-line HTML error page must not
    turn a one-line error into a screenful.
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class ModelError(AgsError):
    """Base of every failure to get a reply from a model server."""


class ModelConfigError(ModelError):
    """The client is set up wrongly (unknown provider, unusable URL, no model name)."""


class ModelNotFound(ModelError):
    """The server does not have the model that was asked for."""

    def __init__(self, model: str, base_url: str, hint: str) -> None:
        super().__init__(f"model {model!r} not found on {base_url}: {hint}")
        self.model = model
        self.base_url = base_url


class ContextTooLong(ModelError):
    """The conversation does not fit the model's context window: the server said so
    (``reported``), or the loop found that even compaction cannot make it fit.

    ``prompt_tokens`` and ``context_tokens`` are the server's own counts when
    its message gave them (llama.cpp and vLLM do; Ollama does not), else None;
    ``base_url`` is None when the loop, not a server, found it.
    """

    def __init__(
        self,
        message: str,
        *,
        base_url: str | None = None,
        detail: str = "",
        prompt_tokens: int | None = None,
        context_tokens: int | None = None,
    ) -> None:
        super().__init__(message)
        self.base_url = base_url
        self.detail = detail
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens

    @classmethod
    def reported(
        cls,
        base_url: str,
        detail: str,
        prompt_tokens: int | None = None,
        context_tokens: int | None = None,
    ) -> ContextTooLong:
        """What a server's refusal of a too-long prompt becomes."""
        if prompt_tokens is not None and context_tokens is not None:
            counts = f" ({prompt_tokens} tokens for a window of {context_tokens})"
        else:
            counts = ""
        return cls(
            f"the conversation is too long for the model's context on {base_url}{counts}: "
            f"compact it or give the model a larger context (server said: {one_line(detail)})",
            base_url=base_url,
            detail=detail,
            prompt_tokens=prompt_tokens,
            context_tokens=context_tokens,
        )


class AuthFailed(ModelError):
    """The server refused the credentials (HTTP 401 or 403)."""

    def __init__(self, base_url: str, status: int, detail: str, key_env: str | None) -> None:
        fix = f"set {key_env} to a valid API key" if key_env else "check the server's access rules"
        super().__init__(
            f"{base_url} refused the request (HTTP {status}: {one_line(detail)}): {fix}"
        )
        self.base_url = base_url
        self.status = status


class ModelRequestFailed(ModelError):
    """The server rejected the request for a reason a retry will not fix (a 4xx)."""

    def __init__(self, base_url: str, status: int | None, detail: str) -> None:
        code = f"HTTP {status}" if status is not None else "error"
        super().__init__(f"{base_url} rejected the request ({code}): {one_line(detail)}")
        self.base_url = base_url
        self.status = status
        self.detail = detail


class ModelUnavailable(ModelError):
    """The server could not be reached or kept failing; retries are exhausted."""

    def __init__(self, base_url: str, attempts: int, last_reason: str) -> None:
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        if last_reason.startswith("HTTP "):  # it answered, with an error each time
            said = f"the model server at {base_url} failed {tries}"
            hint = "it answers, so see its log, or try again later"
        else:
            said = f"no reply from the model server at {base_url} after {tries}"
            hint = "is it running and reachable?"
        super().__init__(f"{said} (last: {one_line(last_reason)}): {hint}")
        self.base_url = base_url
        self.attempts = attempts
        self.last_reason = last_reason


class ModelProtocolError(ModelError):
    """The server answered with something that is not the wire format it claims to speak."""

    def __init__(
        self, base_url: str, detail: str, hint: str = "is the provider right for this server?"
    ) -> None:
        super().__init__(f"unexpected reply from {base_url}: {one_line(detail)} ({hint})")
        self.base_url = base_url
        self.detail = detail


class SandboxError(AgsError):
    """The sandbox could not be made, or could not run a command."""


class DockerUnavailable(SandboxError):
    """No Docker engine answers (not running, wrong DOCKER_HOST, no permission)."""


class ImageMissing(SandboxError):
    """The sandbox image is not on the Docker engine, and ags does not pull images."""

    def __init__(self, image: str) -> None:
        super().__init__(
            f"the sandbox image {image!r} is not on the Docker engine and ags does not pull "
            "images: build or load it (docker build / docker load), or name another with "
            "AGS_IMAGE"
        )
        self.image = image


class ConfinedError(AgsError):
    """A file operation refused by :class:`ConfinedFS`."""


class OutsideRoot(ConfinedError):
    """A path, or a symlink on its way, leads outside the root."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} leads outside the project root; that is not allowed")
        self.path = path


class InvalidPath(ConfinedError):
    """A path that names nothing: empty, with a NUL, not encodable, or too long."""


class NotRegularFile(ConfinedError):
    """The path names something that is not a regular file (a FIFO, a device, a socket)."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"{path} is a {kind}, not a regular file")
        self.path = path
        self.kind = kind


class FileTooLarge(ConfinedError):
    """A whole-file read met a file larger than the caller's limit."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path} is {size} bytes, more than the {limit} bytes allowed here")
        self.path = path
        self.size = size
        self.limit = limit


class FilesChanged(AgsError):
    """``rewind --files`` found files that changed since the agent's tools wrote them
    (by hand, by a shell command); ``changed`` lists ``(path, what is there now)``.
    Nothing was put back and the session did not move."""

    def __init__(self, changed: list[tuple[str, str]]) -> None:
        shown = "; ".join(f"{path} ({why})" for path, why in changed[:10])
        more = f"; and {len(changed) - 10} more" if len(changed) > 10 else ""
        super().__init__(
            f"{len(changed)} file(s) changed since the agent wrote them: {shown}{more}; "
            "nothing was changed (--force puts them back anyway)"
        )
        self.changed = changed


class SourceError(AgsError):
    """A source file that cannot be imported at all (unreadable, not the tool's format)."""
