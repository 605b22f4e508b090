"""The remote rows: push and clone of many sessions to a directory remote, and an
incremental push of one message, against copying JSONL files the way a file sync
(``aws s3 sync``, ``cp -r`` to a USB disk) moves them: one PUT per changed file.

Requests and bytes are counted where they leave the process (``TransferStats``);
for JSONL, a request is one file written and the bytes are the files' sizes.
``python -m bench`` uses a directory remote; against an S3 server (an empty
bucket prefix, credentials in the environment)::

    python -m bench.sync_rows --url s3://bench/run1 --endpoint http://127.0.0.1:8333
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from objstore import Store
from objstore.remote import RemoteLocation, add_remote, open_storage, pull, push, record_push

from .conversations import Conversation, Project
from .jsonl_store import JsonlStore
from .measure import timed
from .report import Row

FORK_PARENT = 1000  # messages of the session the bench forks


def _copy_files(files: list[Path], source: Path, dest: Path) -> tuple[int, int]:
    """Copy files as a file sync would, one PUT each: (requests, bytes)."""
    sent = 0
    for path in files:
        target = dest / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        sent += path.stat().st_size
    return len(files), sent


def sync_rows(
    base: Path,
    sessions: int,
    messages: int,
    project: Project,
    location: RemoteLocation | None = None,
) -> tuple[list[Row], str]:
    conversation, rng = Conversation(project, seed=9), random.Random(9)
    per = max(1, messages // sessions)
    work = [conversation.take(rng.randint(per // 2, per * 3 // 2) or 1) for _ in range(sessions)]
    if location is None:
        (base / "remote").mkdir()
        location = RemoteLocation(str(base / "remote"))
    total = sum(len(m) for m in work)
    with Store.open(base / "ags") as store:
        add_remote(store, "origin", location)
        with store.batch():
            sids = []
            for i, msgs in enumerate(work):
                sid = store.new_session(title=f"session {i}")
                for message in msgs:
                    store.append(sid, message)
                store.release(sid)
                sids.append(sid)
    # Pushed from the store as a later command finds it (closed: its packs merged).
    refs = [f"sessions/{s}" for s in sids]
    with Store.open(base / "ags") as store:
        with open_storage(location) as storage:
            push_s, result = timed(lambda: push(store, storage, refs))
            record_push(store, "origin", result)
            push_stats = (storage.stats.requests, storage.stats.bytes_sent)
        store.append(sids[0], {"role": "user", "content": "one more thing"})
        with open_storage(location) as storage:
            one_s, _ = timed(lambda: push(store, storage, refs[:1]))
            one_stats = (storage.stats.requests, storage.stats.bytes_sent)
        # A fork of a long session the remote has, with one new message of its own.
        long_messages = conversation.take(FORK_PARENT)
        with store.batch():
            long = store.new_session(title="long")
            for message in long_messages:
                store.append(long, message)
            store.release(long)
        with open_storage(location) as storage:
            record_push(store, "origin", push(store, storage, [f"sessions/{long}"]))
        fork = store.fork(f"{long}~2", title="fork")
        store.append(fork, {"role": "user", "content": "try it another way"})
        with open_storage(location) as storage:
            fork_s, _ = timed(lambda: push(store, storage, [f"sessions/{fork}"]))
            fork_stats = (storage.stats.requests, storage.stats.bytes_sent)
    clone_path = base / "clone"
    with Store.open(clone_path) as clone, open_storage(location) as storage:
        add_remote(clone, "origin", location)
        clone_s, _ = timed(lambda: pull(clone, storage, "origin"))
        clone_stats = (storage.stats.requests, storage.stats.bytes_received)

    jsonl_path, copied = base / "jsonl", base / "jsonl-remote"
    with JsonlStore(jsonl_path) as jsonl:
        jids = []
        for i, msgs in enumerate(work):
            jid = jsonl.new_session(title=f"session {i}")
            jsonl.append_many(jid, msgs)
            jids.append(jid)
    files = sorted(p for p in jsonl_path.rglob("*") if p.is_file())
    jpush_s, jpush = timed(lambda: _copy_files(files, jsonl_path, copied))
    with JsonlStore(jsonl_path) as jsonl:
        jsonl.append(jids[0], {"role": "user", "content": "one more thing"})
    changed = [JsonlStore(jsonl_path).path(jids[0])]
    jone_s, jone = timed(lambda: _copy_files(changed, jsonl_path, copied))
    jclone_s, _ = timed(lambda: _copy_files(files, jsonl_path, base / "jsonl-clone"))
    with JsonlStore(jsonl_path) as jsonl:
        jlong = jsonl.new_session(title="long")
        jsonl.append_many(jlong, long_messages)
        jfork = jsonl.fork(jlong, FORK_PARENT - 2)
        jsonl.append(jfork, {"role": "user", "content": "try it another way"})
    forked = [JsonlStore(jsonl_path).path(jfork)]
    jfork_s, jfork_stats = timed(lambda: _copy_files(forked, jsonl_path, copied))

    what = f"{sessions:,} sessions / {total:,} messages"
    rows = [
        Row("push_all", f"push {what}", "s", push_s, jpush_s, "report only", None),
        Row("push_all_requests", "  requests sent", "req", push_stats[0], jpush[0],
            "report only", None),
        Row("push_all_bytes", "  bytes sent", "B", push_stats[1], jpush[1], "report only", None),
        Row("clone_all", f"clone {what}", "s", clone_s, jclone_s, "report only", None),
        Row("clone_all_bytes", "  bytes received", "B", clone_stats[1], jpush[1],
            "report only", None),
        Row("push_one", "push 1 new message", "s", one_s, jone_s, "report only", None),
        Row("push_one_requests", "  requests sent", "req", one_stats[0], jone[0],
            "<= 12 requests", one_stats[0] <= 12),
        Row("push_one_bytes", "  bytes sent", "B", one_stats[1], jone[1], "report only", None),
        Row("push_fork", f"push of a fork with 1 new message of a {FORK_PARENT:,}-message "
            "session", "s", fork_s, jfork_s, "report only", None),
        Row("push_fork_requests", "  requests sent", "req", fork_stats[0], jfork_stats[0],
            "<= 14 requests", fork_stats[0] <= 14),
        Row("push_fork_bytes", "  bytes sent", "B", fork_stats[1], jfork_stats[1],
            "report only", None),
    ]  # fmt: skip
    note = (
        f"remotes: {what} pushed to an empty {'S3' if location.is_s3 else 'directory'} "
        "remote, cloned back, then one "
        "message appended and pushed, then a fork (at ~2) of a pushed "
        f"{FORK_PARENT:,}-message session with one message of its own; ags counts what "
        "RemoteStorage sends (its requests include the 7 of the conditional-write check "
        "before every push); JSONL copies "
        "each file as a file sync does (one PUT per file, the whole file when it changed)"
    )
    return rows, note


def main() -> None:
    import argparse
    import tempfile

    from .conversations import make_project
    from .report import Report, machine_info, write_report

    parser = argparse.ArgumentParser(prog="python -m bench.sync_rows")
    parser.add_argument("--url", required=True, help="an empty remote: s3://bucket/prefix")
    parser.add_argument("--endpoint")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    location = RemoteLocation(args.url, endpoint=args.endpoint)
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="ags-bench-sync-") as base:
        rows, note = sync_rows(Path(base), args.sessions, args.messages, make_project(42), location)
    write_report(Report(machine, {}, rows, [note], False), as_json=False)


if __name__ == "__main__":
    main()
