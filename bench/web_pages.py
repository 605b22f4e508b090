"""The session browser's server time: the list page over many sessions, and one long
transcript page (the first view, which renders every entry, and later ones, which
reuse them), made by the whole app under uvicorn and read to the last byte over
loopback.

The JSONL column is what a viewer of JSONL files pays before it renders
anything: reading every file for its title and count (the list), and reading
and parsing one session's file (the transcript).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn

from objstore import Store
from web.app import bind, create_app
from web.guard import Guard
from web.site import ServeConfig

from .conversations import Conversation, Project
from .jsonl_store import JsonlStore
from .measure import paired_medians
from .report import Row


@contextmanager
def _served(store: Path) -> Iterator[httpx.Client]:
    """The app under uvicorn on a free loopback port, in a thread of this process."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    app = create_app(ServeConfig(store, False, Guard("127.0.0.1", port, None)))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _get(client: httpx.Client, path: str, expect: str) -> None:
    response = client.get(path)
    if response.status_code != 200 or expect not in response.text:
        raise AssertionError(f"{path}: {response.status_code}, {expect!r} not on the page")


def page_rows(base: Path, listed: int, long: int, runs: int, project: Project) -> list[Row]:
    """Median server times of the list page over ``listed`` sessions (and one more, the
    long one) and of the transcript page of a ``long``-message session."""
    rng = random.Random(13)
    conversation = Conversation(project, seed=13)
    ags_path, jsonl_path = base / "ags", base / "jsonl"
    with Store.open(ags_path) as store, store.batch():
        for i in range(listed):
            sid = store.new_session(title=f"session {i}", root=f"/src/p{rng.randint(0, 20)}")
            store.append(sid, {"role": "user", "content": f"task {i}"})
            store.release(sid)
    messages = conversation.take(long)
    with Store.open(ags_path) as store:
        long_sid = store.new_session(title="a long one")
        with store.batch():
            for message in messages:
                store.append(long_sid, message)
    with JsonlStore(jsonl_path) as jsonl:
        for i in range(listed):
            jsonl.append_many(jsonl.new_session(title=f"session {i}"), [{"content": f"t{i}"}])
        long_jid = jsonl.new_session(title="a long one")
        jsonl.append_many(long_jid, messages)

    def read_jsonl_transcript() -> object:
        with open(jsonl_path / f"{long_jid}.jsonl", encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    with _served(ags_path) as client:
        first_s = time.perf_counter()
        _get(client, f"/s/{long_sid}", "a long one")
        first_s = time.perf_counter() - first_s
        list_s, jsonl_list_s = paired_medians(
            lambda: _get(client, "/", "a long one"),
            lambda: JsonlStore(jsonl_path).sessions(),
            runs,
        )
        page_s, jsonl_page_s = paired_medians(
            lambda: _get(client, f"/s/{long_sid}", "a long one"),
            read_jsonl_transcript,
            runs,
        )
    total = listed + 1
    return [
        Row("web_list", f"web: list page, {total:,} sessions", "s", list_s, jsonl_list_s,
            "ags <= 1 s", list_s <= 1.0),
        Row("web_transcript_first", f"web: transcript page, {long:,} msgs, first",
            "s", first_s, jsonl_page_s, "ags <= 3 s", first_s <= 3.0),
        Row("web_transcript", f"web: transcript page, {long:,} msgs", "s", page_s,
            jsonl_page_s, "ags <= 1 s", page_s <= 1.0),
    ]  # fmt: skip
