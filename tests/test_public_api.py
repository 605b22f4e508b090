"""The public API of objstore is what ``objstore.__all__`` lists, and the rest of ags
uses nothing else; every error is in one of the two error modules."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import agent.errors
import objstore
import objstore.errors
import objstore.remote
import objstore.remote.errors
from objstore import AgsError

ROOT = Path(__file__).parent.parent

PUBLIC = {
    # the store and what it returns
    "Store", "SessionInfo", "LogEntry", "Node", "Span", "Target", "ReflogEntry",
    "project_root", "FileChange", "check_file_path",
    # the commands that look after a store, and what they report
    "check_store", "FsckReport", "Problem", "collect_garbage", "GcReport", "MIN_GRACE",
    "store_usage", "session_usage", "StoreUsage", "SessionUsage",
    "diff_sessions", "SessionDiff", "diff_files", "FileDelta",
    "export_session", "encode_document", "read_document", "import_document", "ImportResult",
    "write_private_file",
    "SearchIndex", "SearchHit", "fts_query", "content_text",
    # the limits of the format
    "MAX_DEPTH", "MAX_OBJECT_BYTES", "MAX_DOCUMENT_BYTES", "NestingTooDeep", "depth_exceeds",
    "parse_json",
    # errors
    "AgsError", "InvalidInput", "LimitExceeded", "InvalidName", "BadExport",
    "StoreFormatError", "DamagedPack", "DamagedIndex", "StoreMissing", "UnsafeStore",
    "ObjectError", "ObjectMissing", "CorruptObject", "SpecError", "UnknownSpec",
    "AmbiguousSpec", "RefConflict", "SessionBusy", "SessionArchived", "ForkedHandle",
    "SearchIndexError", "SearchIndexBusy", "StoreWarning",
}  # fmt: skip


# objstore.remote, the storage a sync stands on (docs/REMOTES.md), is a public
# subpackage with an API of its own.
REMOTE_PUBLIC = {
    "RemoteStorage", "Cell", "ObjectInfo", "RemoteLocation",
    "open_storage", "parse_location", "check_remote_name", "checked_marker",
    "add_remote", "remote", "remotes", "remove_remote",
    "RemoteError", "BadRemote", "AccessDenied", "BucketMissing", "ConditionalWritesIgnored",
    "DamagedRemoteKey", "KeyMissing", "NoCredentials", "RemoteUnreachable", "SwapFailed",
    "TransferStats",
    # the sync: push, fetch, pull, remote gc, and what they report
    "push", "record_push", "delete_refs", "PushResult", "RefPush",
    "fetch", "pull", "FetchResult", "RefFetch", "SessionPull",
    "collect_remote_garbage", "RemoteGcReport",
}  # fmt: skip


def test_the_public_api_is_exactly_the_list() -> None:
    for package, names in ((objstore, PUBLIC), (objstore.remote, REMOTE_PUBLIC)):
        assert set(package.__all__) == names
        assert len(package.__all__) == len(names)
        for name in names:
            assert getattr(package, name) is not None


def objstore_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from objstore[...] import name`` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "objstore":
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("objstore") for a in node.names), path
    return found


def test_the_command_line_the_agent_the_web_pages_and_the_bench_use_only_the_public_api() -> None:
    outside = []
    for folder in ("cli", "agent", "web", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for module, name in objstore_imports(path):
                public = REMOTE_PUBLIC if module == "objstore.remote" else PUBLIC
                if module not in ("objstore", "objstore.remote") or name not in public:
                    outside.append(f"{path.relative_to(ROOT)}: {module}.{name}")
    assert outside == []


def error_classes(module: object) -> list[type[BaseException]]:
    return [
        c for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, BaseException) and c.__module__ == module.__name__  # type: ignore[attr-defined]
    ]  # fmt: skip


def test_every_error_is_an_ags_error_defined_in_an_error_module() -> None:
    for module in (objstore.errors, objstore.remote.errors, agent.errors):
        for cls in error_classes(module):
            allowed = (objstore.StoreWarning, objstore.NestingTooDeep)
            assert issubclass(cls, AgsError) or cls in allowed, cls
            assert cls.__name__ in (module.__doc__ or ""), f"{cls.__name__} is not in the tree"
    elsewhere = []
    for folder in ("objstore", "agent"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    getattr(base, "id", "").endswith(("Error", "Busy", "Missing"))
                    or getattr(base, "id", "") in {"AgsError", "InvalidInput"}
                    for base in node.bases
                ):
                    elsewhere.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert elsewhere == []
