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
