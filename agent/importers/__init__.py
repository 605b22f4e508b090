"""Importers of other agents' session files: Claude Code, Codex CLI, Gemini CLI.

``import_sessions(store, "claude-code", paths)`` finds the tool's session
files under ``paths`` (default: the tool's own folder), reads each into the
common message shape (one module per tool), and writes it with
``session_writer.write_source``: idempotent, incremental, and never a silent
rewrite. docs/IMPORT.md says which versions and record types each one knows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from objstore import AgsError, Store

from ..errors import SourceError
from . import claude_code, codex, gemini
from .records import TOOL_NAMES, ImportRow, find_files, stat_of
from .session_writer import Claims, unchanged_by_stat, write_source

__all__ = ["TOOL_NAMES", "ImportRow", "default_paths", "import_sessions"]


@dataclass(frozen=True, slots=True)
class _Tool:
    default_paths: Callable[[], list[Path]]
    accepts: Callable[[Path], bool]
    sources: Callable[[Path], Sequence[Any]]
    later: Callable[[Path], bool]  # files that need others imported first


_TOOLS = {
    "claude-code": _Tool(
        claude_code.default_paths,
        claude_code.accepts,
        claude_code.sources,
        claude_code.is_agent_file,
    ),
    "codex": _Tool(codex.default_paths, codex.accepts, codex.sources, lambda p: False),
    "gemini": _Tool(gemini.default_paths, gemini.accepts, gemini.sources, lambda p: False),
}


def default_paths(tool: str) -> list[Path]:
    return _TOOLS[tool].default_paths()


def import_sessions(
    store: Store,
    tool: str,
    paths: Sequence[Path] = (),
    *,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
    on_wait: Callable[[], None] | None = None,
) -> list[ImportRow]:
    """Import every session file of ``tool`` under ``paths``; one row per file.
    Another import of the store under way is waited for (``on_wait`` is told)."""
    if dry_run:  # reads only: nothing to keep apart
        return _import_all(store, tool, paths, dry_run, progress)
    # One import of a store at a time: two at once each took a file for new and made
    # a session of it (a claim is read, then written, with no lock between).
    with store.one_at_a_time("import", on_wait):
        return _import_all(store, tool, paths, dry_run, progress)


def _import_all(
    store: Store,
    tool: str,
    paths: Sequence[Path],
    dry_run: bool,
    progress: Callable[[int, int], None] | None,
) -> list[ImportRow]:
    spec = _TOOLS[tool]
    roots = list(paths) or spec.default_paths()
    missing = [p for p in roots if not p.exists()]
    if missing and paths:
        raise AgsError(f"no such file or folder: {missing[0]}")
    # A file given by name is taken whatever its name; folders are searched for the tool's files.
    files, unreadable = find_files([p for p in roots if p.exists()], spec.accepts)
    files.sort(key=spec.later)  # stable: oldest first within each group
    claims = Claims.load(store)
    rows = [
        ImportRow(str(folder), tool, status="failed", problems=[f"cannot search it: {why}"])
        for folder, why in unreadable
    ]
    for done, path in enumerate(files, 1):
        rows.append(_import_file(store, tool, spec, path, claims, dry_run))
        if progress is not None:
            progress(done, len(files))
    return rows


def _import_file(
    store: Store, tool: str, spec: _Tool, path: Path, claims: Claims, dry_run: bool
) -> ImportRow:
    try:
        size, mtime_ns = stat_of(path)
    except OSError as e:
        return ImportRow(str(path), tool, status="failed", problems=[f"cannot read: {e.strerror}"])
    except SourceError as e:
        return ImportRow(str(path), tool, status="failed", problems=[str(e)])
    same = unchanged_by_stat(claims, path, size, mtime_ns)
    if same is not None:
        imp = same.imported or {}
        return ImportRow(
            str(path), tool, same.id, "unchanged", same.messages, records=int(imp.get("records", 0))
        )
    try:
        sources = spec.sources(path)
        if not sources:
            return ImportRow(str(path), tool, problems=["no conversation in this file yet"])
        row = write_source(store, sources[0], claims, dry_run=dry_run)
        for extra in sources[1:]:
            linked = write_source(store, extra, claims, dry_run=dry_run)
            if linked.session:
                row.linked.append(linked.session)
            row.problems += [f"sidechain: {p}" for p in linked.problems]
            if linked.status != "unchanged" and row.status == "unchanged":
                row.status = "updated"
    except (SourceError, AgsError) as e:
        return ImportRow(str(path), tool, status="failed", problems=[str(e)])
    except OSError as e:
        return ImportRow(
            str(path), tool, status="failed", problems=[f"{e.strerror or e}: {e.filename or path}"]
        )
    return row
