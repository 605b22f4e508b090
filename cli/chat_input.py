"""What a person types into ``ags chat`` on a terminal: the prompt (line editing,
history across runs, multi-line input, completion of backslash commands and
session ids, the status line under it) and single-key answers.

Keys at the prompt: Enter sends; Alt-Enter starts a new line, and so does
Enter after a trailing backslash (the backslash is dropped); Tab
completes; Up and Down walk the history; Ctrl-C clears what is typed, and at
an empty prompt asks to be pressed again to leave; Ctrl-D at an empty prompt
leaves.

The history is what a person typed, which can hold anything they pasted: it
is kept in a file only its owner can read (0600, in a 0700 directory when ags
makes it), never written through a symbolic link. ``AGS_HISTORY`` names the
file; empty keeps no history; the default is ``$XDG_STATE_HOME/ags/history``
(``~/.local/state/ags/history``).
"""

from __future__ import annotations

import datetime
import os
import stat
import sys
import termios
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

import click
from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

from objstore import Store

from .chat_commands import CommandSpec
from .output import one_line, short

HISTORY_ENV: Final = "AGS_HISTORY"
LEAVE_HINT: Final = "Ctrl-C again to leave (or Ctrl-D)"


def history_path() -> Path | None:
    """Where the prompt's history is kept; None for nowhere (``AGS_HISTORY`` empty)."""
    given = os.environ.get(HISTORY_ENV)
    if given is not None:
        return Path(given).expanduser() if given else None
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "ags" / "history"


class PrivateHistory(FileHistory):
    """prompt_toolkit's history file, readable by its owner only and never reached
    through a symbolic link: made 0600 (an existing one too), appended to with
    O_NOFOLLOW. The format is FileHistory's (``+`` before each line of an entry)."""

    def __init__(self, path: Path) -> None:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True)
        fd = _open_private(path, os.O_RDONLY)
        os.close(fd)
        super().__init__(str(path))

    def store_string(self, string: str) -> None:
        fd = _open_private(Path(str(self.filename)), os.O_WRONLY | os.O_APPEND)
        lines = "".join(f"+{line}\n" for line in string.split("\n"))
        entry = f"\n# {datetime.datetime.now()}\n{lines}"
        with os.fdopen(fd, "ab") as f:
            f.write(entry.encode("utf-8", errors="replace"))


def _open_private(path: Path, flags: int) -> int:
    """Open (creating) ``path`` as a regular file of this user's, mode 0600."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_uid != os.getuid():
            raise OSError(f"{path} belongs to another user")
        if stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_history(path: Path | None) -> tuple[History, str]:
    """The prompt's history, and where it is kept (for ``\\help``): in memory only
    when there is no file, or the file cannot be used (and why)."""
    if path is None:
        return InMemoryHistory(), f"not kept ({HISTORY_ENV} is empty)"
    try:
        return PrivateHistory(path), f"kept in {one_line(str(path))} (mode 0600)"
    except OSError as e:
        why = e.strerror or str(e)
        return InMemoryHistory(), f"not kept: {one_line(str(path))}: {one_line(why)}"


class ChatCompleter(Completer):
    """Completes ``\\`` commands at the start of the input, and session ids (with
    their titles beside them) after a command that takes one."""

    def __init__(self, commands: Iterable[CommandSpec], store: Store) -> None:
        self.commands = {c.name: c for c in commands}
        self.store = store
        self._sessions: list[tuple[str, str]] | None = None

    def forget_sessions(self) -> None:
        """Sessions may have changed: list them afresh when next asked."""
        self._sessions = None

    def get_completions(self, document: Document, event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor
        if not text.startswith("\\") or "\n" in text:
            return
        name, space, arg = text[1:].partition(" ")
        if not space:
            for command in self.commands.values():
                if command.name.startswith(name):
                    yield Completion("\\" + command.name, -len(text), display_meta=command.help)
            return
        wanted = self.commands.get(name)
        if wanted is None or not wanted.takes_session or " " in arg:
            return
        for sid, title in self._session_rows():
            if sid.startswith(arg) or (arg and arg.lower() in title.lower()):
                yield Completion(sid, -len(arg), display=short(sid), display_meta=title)

    def _session_rows(self) -> list[tuple[str, str]]:
        if self._sessions is None:
            rows = self.store.sessions()[:200]
            self._sessions = [(s.id, one_line(s.title, "(untitled)")[:60]) for s in rows]
        return self._sessions


class ChatPrompt:
    """The input line of ``ags chat`` on a terminal."""

    def __init__(self, completer: ChatCompleter, history: History) -> None:
        self.completer = completer
        self.status = ""
        self._leaving = False  # Ctrl-C at an empty prompt: the next one leaves
        self.session: PromptSession[str] = PromptSession(
            history=history,
            completer=completer,
            complete_while_typing=True,
            key_bindings=self._bindings(),
            bottom_toolbar=self._toolbar,
            prompt_continuation=lambda width, line, wrap: ". ".rjust(width),
            enable_open_in_editor=False,
        )
        self.session.default_buffer.on_text_changed += self._typed

    def read(self, status: str) -> str:
        """The next input; EOFError when the person leaves (Ctrl-D, Ctrl-C twice)."""
        self.status = status
        self._leaving = False
        self.completer.forget_sessions()
        return self.session.prompt(FormattedText([("bold", "> ")]))

    def _typed(self, _buffer: object) -> None:
        self._leaving = False

    def _toolbar(self) -> FormattedText:
        if self._leaving:
            return FormattedText([("", f" {LEAVE_HINT}")])
        return FormattedText([("", f" {self.status}")])

    def _bindings(self) -> KeyBindings:
        keys = KeyBindings()

        # Not Ctrl-J: a terminal in cooked mode turns Enter typed ahead into it.
        @keys.add("escape", "enter")
        def _newline(event: KeyPressEvent) -> None:
            event.current_buffer.insert_text("\n")

        @keys.add("enter")
        def _enter(event: KeyPressEvent) -> None:
            buffer = event.current_buffer
            text = buffer.text
            at_end = buffer.cursor_position == len(text)
            if at_end and text.endswith("\\") and text.strip() != "\\":
                buffer.delete_before_cursor(1)
                buffer.insert_text("\n")
                return
            buffer.validate_and_handle()

        @keys.add("c-c")
        def _interrupt(event: KeyPressEvent) -> None:
            buffer = event.current_buffer
            if buffer.text:
                buffer.reset()
                self._leaving = False
            elif self._leaving:
                event.app.exit(exception=EOFError)
            else:
                self._leaving = True

        return keys


@contextmanager
def quiet_keys() -> Iterator[None]:
    """Keys typed while a turn runs are not echoed into its output (they wait
    for the next prompt, or are dropped by an approval); Ctrl-C still stops the
    turn (the terminal still turns it into SIGINT)."""
    fd = sys.stdin.fileno()
    try:
        saved = termios.tcgetattr(fd)
    except (OSError, termios.error):
        yield  # not a terminal after all
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ICANON)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def read_key(keys: str) -> str:
    """One key of ``keys`` (lower case), read without Enter, once the question is
    shown. Keys typed before are dropped: what someone typed ahead must never
    answer it. Escape is ``n``; Ctrl-C raises KeyboardInterrupt and Ctrl-D
    EOFError."""
    with suppress(OSError, termios.error):
        termios.tcflush(sys.stdin.fileno(), termios.TCIFLUSH)
    while True:
        key = click.getchar()
        if key == "\x1b" and "n" in keys:
            return "n"
        if len(key) == 1 and key.lower() in keys:
            return key.lower()
