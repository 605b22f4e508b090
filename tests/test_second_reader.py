"""A second reader written from docs/FORMAT.md alone (tests/second_reader.py) reads
what objstore wrote, and finds the same sessions, transcripts and contexts."""

from __future__ import annotations

from pathlib import Path

import second_reader

from objstore import Store, export_session, import_document


def build(path: Path) -> tuple[dict[str, str], Store]:
    """A store with what ags writes: packs sealed and open, spans, a compaction, a
    fork, a tag, a rewind, a title, a deleted session, loose objects from a batch."""
    with Store.open(path) as s:
        a = s.new_session(title="a", root=str(path.parent))
        for i in range(40):
            s.append(a, {"role": "user" if i % 2 else "assistant", "content": f"a{i}"},
                     state={"i": i} if i % 5 == 0 else None)  # fmt: skip
        s.compact(a, "the story so far", keep=3)
        for i in range(20):
            s.append(a, {"role": "user", "content": f"after {i}"})
        fork = s.fork(f"{a}~30", title="fork")
        s.append(fork, {"role": "user", "content": "on the fork"})
        s.tag("kept", f"{a}~5")
        s.rewind(a, f"{a}~2")
        s.set_title(a, "renamed")
        s.append(
            fork,
            {"role": "tool", "content": "wrote"},
            files={"src/new.py": (None, b"x = 1\n"), "data.bin": (b"\x00\x01", b"\xff")},
        )
        s.append(fork, {"role": "tool", "content": "deleted"},
                 files={"src/new.py": (b"x = 1\n", None)})  # fmt: skip
        gone = s.new_session()
        s.append(gone, {"role": "user", "content": "doomed"})
        s.delete(gone)
        copy = import_document(s, export_session(s, fork), new_session=True).session
        assert copy is not None
    writer = Store.open(path)  # left open: its pack has no index yet
    writer.append(fork, {"role": "user", "content": "while a writer is open"})
    return {"a": a, "fork": fork, "copy": copy, "gone": gone}, writer


def test_the_second_reader_reads_what_objstore_wrote(tmp_path: Path) -> None:
    path = tmp_path / "store"
    ids, writer = build(path)
    other = second_reader.Store.read(path)
    # Read while the writer is open: its last append is only in its pack's journal.
    live_sessions = other.sessions()
    writer.close()
    assert other.spans_agree()
    assert second_reader.file_modes(path) <= {0o600, 0o700}
    with Store.open(path) as s:
        listed = {info.id: info for info in s.sessions(include_archived=True)}
        assert set(live_sessions) == set(listed)
        assert live_sessions == other.sessions()  # the files written when the pack sealed
        for sid, ref in live_sessions.items():
            info = listed[sid]
            assert ref["target"] == info.head and ref["meta"]["title"] == info.title
            assert ref["meta"]["messages"] == info.messages
            assert other.transcript(ref["target"]) == [e.message for e in s.log(sid)][::-1]
            assert other.context(ref["target"]) == s.context(sid)
        assert other.ref("tags/kept") == {"generation": 1, "target": s.node_id("kept")}
        moves = [e["reason"] for e in other.reflog(f"sessions/{ids['a']}")]
        assert moves[-2:] == ["rewind to " + f"{ids['a']}~2", "title"]
        assert other.ref(f"sessions/{ids['gone']}") is None
        assert other.reflog(f"sessions/{ids['gone']}")[-1]["new"] is None
        assert set(other.objects) == set(s.object_ids())
        for node in s.walk(ids["fork"]):
            assert other.files(node.id) == {
                f.path: (
                    None if f.before is None else s.file_bytes(f.before),
                    None if f.after is None else s.file_bytes(f.after),
                )
                for f in node.files
            }
        assert other.files(s.node_id(f"{ids['fork']}~2")) == {
            "data.bin": (b"\x00\x01", b"\xff"),
            "src/new.py": (None, b"x = 1\n"),
        }
