"""Export a session as one self-contained JSON document, and import one back.

The document (schema: ``export.schema.json``, also ``docs/export.schema.json``)
holds the session's metadata, its head, and every object the head reaches,
decoded, each with its id. It is readable without ags: an id is the BLAKE3 of
``kind + NUL + canonical JSON of body``, or for a ``file`` object (version 2)
of ``file + NUL + its bytes``, which the document holds in base64 as ``data``.
Documents of version 1 (no file objects) import as they always did.

Import trusts nothing in the file. It reads no more than the document limit,
parses with a nesting limit, checks the schema, recomputes every id, checks
each object's size, parses every node, and checks every link before it writes
anything; then it writes the objects (one sync), each after every object it
links to, and the ref last. Times in the
session metadata are normalised, and a time in the future is clamped to the
moment of import. Importing the same file twice changes nothing the second
time; importing a later export of the same session moves its head forward; a
session that has diverged is refused. The limits are in ``limits.py``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
import time
from calendar import timegm
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any, Final

from . import canonical, objects
from .errors import (
    AgsError,
    BadExport,
    InvalidInput,
    NestingTooDeep,
    ObjectError,
    RefConflict,
    SessionArchived,
)
from .limits import (
    DOCUMENT_DEPTH,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_OBJECT_BYTES,
    parse_json,
)
from .nodes import Node, parse_node
from .reach import in_link_order, node_links
from .refs import now_iso, second_text, session_ref
from .store import META_FIELDS, Store, new_session_id
from .walk import walk

EXPORT_FORMAT: Final = "ags-export"
EXPORT_VERSION: Final = 2  # 2: file objects and nodes' ``files`` (FORMAT.md 12)
READ_CHUNK: Final = 1 << 20
TIME_FIELDS: Final = ("created", "updated", "archived_at")  # session times import checks
SCHEMA_PATH: Final = Path(__file__).with_name("export.schema.json")


@cache
def export_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text("utf-8"))
    return schema


def export_session(store: Store, spec: str) -> dict[str, Any]:
    """The export document of what ``spec`` names: a session (at its head) or a node."""
    target = store.target(spec)
    session = None
    if target.session is not None:
        info = store.session(target.session)
        session = {"id": info.id, **{name: getattr(info, name) for name in META_FIELDS}}
        if target.node != info.head:  # a node inside the session: export it as a fork
            head_messages = store.node(target.node).messages if target.node else 0
            session = {**session, "messages": head_messages}
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": now_iso(),
        "head": target.node,
        "session": session,
        "objects": list(_objects_from(store, target.node)),
    }


def encode_document(doc: dict[str, Any], escape: Callable[[str], str] | None = None) -> bytes:
    """The bytes ``ags export`` writes for a document; InvalidInput if they would be
    over the document limit, which import refuses (export an earlier node instead).

    ``escape`` may rewrite the JSON text into equal JSON (the command line writes
    terminal control characters as ``\\u`` escapes)."""
    text = json.dumps(doc, ensure_ascii=False, indent=1)
    data = (escape(text) if escape else text).encode("utf-8") + b"\n"
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InvalidInput(
            f"the export would be {len(data):,} bytes, over the limit of an export document "
            f"({MAX_DOCUMENT_BYTES:,} bytes): export an earlier node (SPEC~N)"
        )
    return data


def _objects_from(store: Store, head: str | None) -> Any:
    """Every object ``head`` reaches, newest node first, each node's blobs after it."""
    seen: set[str] = set()
    stack = [head] if head else []
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node_kind, node_body = store.raw_object(nid)
        yield {"id": nid, "kind": node_kind, "body": canonical.loads(node_body)}
        later: list[str] = []
        for link in node_links(store.node(nid)):
            if link.target in seen:
                continue
            if link.kind != "node":
                seen.add(link.target)
                yield _exported(link.target, *store.raw_object(link.target))
            elif link.field == "parent":
                later.insert(0, link.target)  # popped last: the chain reads newest first
            else:
                later.append(link.target)
        stack += later


def _exported(oid: str, kind: str, body: bytes) -> dict[str, Any]:
    """A leaf object as the document holds it: a blob decoded, a file in base64."""
    if kind == "file":
        return {"id": oid, "kind": kind, "data": base64.b64encode(body).decode("ascii")}
    return {"id": oid, "kind": kind, "body": canonical.loads(body)}


@dataclass(frozen=True, slots=True)
class ImportResult:
    session: str | None
    head: str | None
    objects: int  # objects in the document
    action: str  # "created", "fast-forward", "unchanged"


def read_document(stream: IO[bytes], name: str = "the document") -> dict[str, Any]:
    """Read and parse the export document from ``stream``, never more than the
    document limit of it: a file that says it is bigger is refused before it is
    read, a pipe as soon as the limit is passed."""
    too_big = BadExport(f"{name} is over {MAX_DOCUMENT_BYTES:,} bytes, the limit of a document")
    data = bytearray()
    try:
        with suppress(AttributeError, OSError, ValueError):  # no file behind it: just read
            st = os.fstat(stream.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size > MAX_DOCUMENT_BYTES:
                raise too_big
        while chunk := stream.read(min(READ_CHUNK, MAX_DOCUMENT_BYTES + 1 - len(data))):
            data += chunk
            if len(data) > MAX_DOCUMENT_BYTES:
                raise too_big
    except OSError as e:
        raise InvalidInput(f"cannot read {name}: {e.strerror or e}") from None
    text = _utf8(data)
    del data  # from here the text alone: a big document is held once, not twice
    return parse_document(text)


def parse_document(data: str | bytes) -> dict[str, Any]:
    """The JSON document in ``data``, or a BadExport that says where it breaks."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise BadExport(f"the document is over {MAX_DOCUMENT_BYTES:,} bytes, the limit")
    text = _utf8(data) if isinstance(data, bytes) else data
    try:
        doc = parse_json(text, DOCUMENT_DEPTH, parse_constant=_no_constant)
    except NestingTooDeep:
        raise BadExport(
            f"nested deeper than an export document may be ({DOCUMENT_DEPTH} levels: "
            f"{MAX_DEPTH} in an object's body)"
        ) from None
    except json.JSONDecodeError as e:
        body = text.strip()
        if not body:
            raise BadExport("the file is empty (truncated?)") from None
        if e.msg == "Extra data":
            what = "not valid JSON, something follows the document"
        elif body.startswith("{") and not body.endswith("}"):
            what = "truncated, not valid JSON"
        else:
            what = "not valid JSON"
        raise BadExport(f"{what}: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:  # a NaN, or an integer of more digits than Python converts
        why = "an integer of too many digits" if "digits" in str(e) else str(e)
        raise BadExport(f"not valid JSON: {why}") from None
    if not isinstance(doc, dict):
        raise BadExport("$: an export document is a JSON object")
    return doc


def _utf8(data: bytes | bytearray) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadExport(f"not UTF-8 text (byte {e.start})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def check_document(doc: dict[str, Any]) -> tuple[dict[str, tuple[str, bytes]], dict[str, Node]]:
    """Verify a parsed document fully; return its objects by id and its nodes parsed."""
    if doc.get("format") != EXPORT_FORMAT:
        raise BadExport(f"$.format: not an ags export (expected {EXPORT_FORMAT!r})")
    version = doc.get("version")
    if type(version) is int and version > EXPORT_VERSION:
        raise BadExport(
            f"$.version: export version {version} is newer than this ags reads ({EXPORT_VERSION})"
        )
    _check_schema(doc)

    by_id: dict[str, tuple[str, bytes]] = {}
    where: dict[str, str] = {}
    for i, obj in enumerate(doc["objects"]):
        place = f"$.objects[{i}]"
        if obj["kind"] == "file":
            if version == 1:
                raise BadExport(f"{place}: a file object needs export version 2")
            field = f"{place}.data"
            body = _file_data(obj["data"], field)
        else:
            field = f"{place}.body"
            try:
                canonical.check_json(obj["body"], field, MAX_DEPTH)
                body = canonical.dumps(obj["body"], field)
            except AgsError as e:
                raise BadExport(str(e)) from None
        if len(body) > MAX_OBJECT_BYTES:
            raise BadExport(
                f"{field}: {len(body):,} bytes, over the limit of one object "
                f"({MAX_OBJECT_BYTES:,} bytes)"
            )
        oid = objects.object_id(obj["kind"], body)
        if oid != obj["id"]:
            raise BadExport(
                f"{place}: content does not match its id {obj['id']} (it hashes to {oid})"
            )
        by_id[oid] = (obj["kind"], body)
        where.setdefault(oid, place)

    nodes: dict[str, Node] = {}
    for oid, (kind, body) in by_id.items():
        if kind == "node":
            try:
                nodes[oid] = parse_node(oid, body)
            except ObjectError as e:
                raise BadExport(f"{where[oid]}: {e}") from None
    for oid, node in nodes.items():
        for link in node_links(node):
            have = by_id.get(link.target)
            if have is None:
                raise BadExport(
                    f"{where[oid]}.body.{link.field}: names {link.target}, which is not in the file"
                )
            if have[0] != link.kind:
                raise BadExport(
                    f"{where[oid]}.body.{link.field}: names a {have[0]}, not a {link.kind}"
                )

    head, session = doc["head"], doc["session"]
    if head is not None and head not in nodes:
        raise BadExport(f"$.head: names {head}, which is not a node in the file")
    if session is not None:
        for name in TIME_FIELDS:
            if session.get(name) is not None:
                _import_time(session[name], f"$.session.{name}")  # a real date
        count = nodes[head].messages if head else 0
        if session["messages"] != count:
            raise BadExport(f"$.session.messages: says {session['messages']}, head has {count}")
    return by_id, nodes


def _file_data(text: str, where: str) -> bytes:
    """The bytes of a file object's ``data`` (standard base64, padded)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadExport(f"{where}: not base64 ({e})") from None


def _check_schema(doc: dict[str, Any]) -> None:
    import jsonschema  # only import pays for it

    validator = jsonschema.Draft202012Validator(export_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        # The message quotes the value (a title of 100 KB, whole): shown cut short.
        quoted = repr(error.instance)
        message = error.message
        if len(quoted) > 60:
            message = message.replace(quoted, quoted[:50] + "...")
        raise BadExport(f"{error.json_path}: {message[:300]}")


def import_document(
    store: Store, doc: dict[str, Any], *, new_session: bool = False
) -> ImportResult:
    """Check ``doc`` (see ``check_document``), then write its objects and its session ref.

    With ``new_session`` (or when the document names no session), a new
    session id is made; otherwise the exported id is kept.
    """
    by_id, nodes = check_document(doc)
    head: str | None = doc["head"]
    meta = dict(doc["session"] or {})
    sid = meta.pop("id", None)
    now = int(time.time() * 1000)
    for name in TIME_FIELDS:
        if meta.get(name) is not None:
            meta[name] = _time_text(min(_import_time(meta[name], name), now))
    if new_session or sid is None:
        sid = None
    else:
        _check_existing(store, sid, head, nodes)
    with store.batch():
        for oid in _write_order(by_id, nodes):
            kind, body = by_id[oid]
            if store.put_raw(kind, body) != oid:  # cannot happen: checked above
                raise BadExport(f"object {oid} changed while it was imported")
        if sid is None:
            sid = new_session_id()
            meta.setdefault("created", now_iso())
            meta.setdefault("updated", meta["created"])
            meta.setdefault("messages", nodes[head].messages if head else 0)
        try:
            action = store.fast_forward(sid, head, meta, "import")
        except RefConflict:
            raise RefConflict(f"session {sid} moved while it was being imported") from None
    return ImportResult(sid, head, len(by_id), action)


def _write_order(by_id: dict[str, tuple[str, bytes]], nodes: dict[str, Node]) -> Iterator[str]:
    """The document's objects in the order import writes them: blobs and files first,
    then each node after every node it links to (``reach.in_link_order``), whatever
    the document's order (ags writes the newest node first). An import killed midway
    then leaves only objects whose links all name objects written before them."""
    yield from (oid for oid, (kind, _body) in by_id.items() if kind != "node")
    yield from (oid for oid in in_link_order(nodes, nodes.__getitem__) if oid in nodes)


def _import_time(text: str, where: str) -> int:
    """Milliseconds since the epoch of a time the schema let through
    (``...T..:..:..[.f]Z``); BadExport for one that is not a real date (month 13)."""
    whole, _, fraction = text[:-1].partition(".")
    try:
        seconds = timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        raise BadExport(f"{where}: {text!r} is not a real time") from None
    return seconds * 1000 + int(fraction.ljust(3, "0")[:3])


def _time_text(ms: int) -> str:
    """The time format of refs (``refs.iso_time``), from whole milliseconds."""
    return f"{second_text(ms // 1000)}.{ms % 1000:03d}Z"


def _check_existing(store: Store, sid: str, head: str | None, nodes: dict[str, Node]) -> None:
    """Refuse, before anything is written, an import that could only conflict."""
    rec = store.read_ref(session_ref(sid))
    if rec is None or rec.target == head:
        return
    if rec.body.get("meta", {}).get("archived_at"):
        raise SessionArchived(sid)
    if not _descends(nodes, head, rec.target):
        raise RefConflict(
            f"session {sid} exists here with a different history (head {rec.target}); "
            "import with --new-session to keep both"
        )


def _descends(nodes: dict[str, Node], head: str | None, ancestor: str | None) -> bool:
    """Whether ``ancestor`` is on the chain of ``head`` (None is on every chain)."""
    return ancestor is None or any(node.id == ancestor for node in walk(head, nodes.get))
