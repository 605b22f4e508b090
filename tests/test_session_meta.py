"""Store.set_meta: descriptive session metadata changed apart from the history."""

from __future__ import annotations

from pathlib import Path

import pytest

from objstore import InvalidInput, Store


def test_set_meta_changes_only_what_it_may(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as s:
        sid = s.new_session(title="t")
        s.append(sid, {"role": "user", "content": "hi"})
        head = s.session(sid).head
        s.set_meta(sid, "import", created="2020-01-02T03:04:05.678Z", model="m",
                   imported={"tool": "x", "records": 3}, root=str(tmp_path))  # fmt: skip
        info = s.session(sid)
        assert (info.created, info.model, info.imported, info.head) == (
            "2020-01-02T03:04:05.678Z",
            "m",
            {"tool": "x", "records": 3},
            head,
        )
        assert info.root == str(tmp_path.resolve())
        assert s.reflog(sid)[0].reason == "import"
        refused = [
            {"messages": 9},
            {"updated": "2020-01-02T03:04:05.678Z"},
            {"created": "yesterday"},
            {"imported": [1]},
            {"title": "x" * 2000},
        ]
        for bad in refused:
            with pytest.raises(InvalidInput):
                s.set_meta(sid, **bad)
        assert s.session(sid) == info


def test_times_read_the_same_across_seconds_and_threads() -> None:
    """``iso_time`` formats a second once; every time still reads as strftime gives it."""
    import threading
    import time

    from objstore.refs import iso_time

    def expected(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"

    times = [-1.0, -0.5, 0.0, 0.9995, 1.0, 59.999, 60.0, 1.7e9 + 0.123, 1.7e9 + 0.9999, 1.7e9 + 1]
    for t in times + times[::-1]:
        assert iso_time(t) == expected(t), t
    wrong: list[float] = []

    def work(offset: int) -> None:
        for i in range(2000):
            t = 1.7e9 + (i * 7 + offset) % 50 + 0.25
            if iso_time(t) != expected(t):
                wrong.append(t)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
