"""A store with what the session browser must show: Markdown and code, tool calls and
their results, a compaction, forks, an archived session, and hostile content."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from objstore import Store

HOSTILE_TITLE = '<img src=x onerror="window.__pwned=1">evil \u202etxt.exe'
HOSTILE_TEXT = "\n\n".join(
    [
        "<script>window.__pwned = 1</script>",
        '<img src=x onerror="window.__pwned=1">',
        "[click me](javascript:window.__pwned=1) and [also](JAVASCRIPT:window.__pwned=1)",
        "[data](data:text/html,<script>window.__pwned=1</script>)",
        "![pixel](http://127.0.0.1:9/beacon.png)",
        '<a href="javascript:window.__pwned=1">raw link</a>',
        '<svg onload="window.__pwned=1"></svg><iframe src="javascript:window.__pwned=1">',
        '<details open ontoggle="window.__pwned=1">x</details>',
        "```html\n<script>window.__pwned=1</script>\n```",
        "bidi: \u202eevil\u202c and an escape \x1b[31mred",
        '<style>body{display:none}</style><form action="/s/x/delete" method="post">',
    ]
)


@dataclass(frozen=True, slots=True)
class Demo:
    main: str  # a session with Markdown, code, tool calls, a compaction
    fork: str  # forked from main at its fourth entry
    hostile: str
    archived: str
    fork_node: str
    result_node: str  # the result of the shell call in main


def build_demo_store(path: Path) -> Demo:
    with Store.open(path) as s:
        main = s.new_session(title="Fix the failing build", root="/src/app", model="gemma4")
        s.append(main, {"role": "user", "content": "The **tests** fail. Can you look?"})
        s.append(
            main,
            {
                "role": "assistant",
                "content": "Let me run them first.",
                "tool_calls": [{"id": "call_1", "name": "shell",
                                "arguments": {"command": "pytest -q tests/"}}],
            },
            meta={"model": "gemma4", "duration": 2.5,
                  "usage": {"prompt_tokens": 1234, "completion_tokens": 56}},
        )  # fmt: skip
        result = s.append(
            main,
            {"role": "tool", "tool_call_id": "call_1", "name": "shell",
             "content": "FAILED tests/test_app.py::test_add - assert 3 == 4\n1 failed"},
            meta={"ok": True},
        )  # fmt: skip
        fork_node = s.append(
            main,
            {
                "role": "assistant",
                "content": "The bug is in `add`:\n\n```python\ndef add(a, b):\n"
                "    return a - b  # wrong\n```\n\nI will fix it.",
                "tool_calls": [{"id": "call_2", "name": "write_file",
                                "arguments": {"path": "app.py",
                                              "content": "def add(a, b):\n    return a + b\n"}}],
            },
            meta={"model": "gemma4", "duration": 1.2,
                  "usage": {"prompt_tokens": 1400, "completion_tokens": 80}},
        )  # fmt: skip
        s.append(
            main,
            {"role": "tool", "tool_call_id": "call_2", "name": "write_file",
             "content": "wrote app.py (32 bytes)"},
            meta={"ok": True},
        )  # fmt: skip
        s.compact(main, "The user's tests failed; `add` subtracted. Fixed app.py.", keep=0)
        s.append(main, {"role": "user", "content": "Thanks! Now run them again."})
        s.append(main, {"role": "assistant", "content": "All | good\n---|---\n1 | passed"})
        fork = s.fork(f"{main}~4", title="Try a different fix")
        s.append(fork, {"role": "user", "content": "Rewrite it with `operator.add` instead."})
        hostile = s.new_session(title=HOSTILE_TITLE, root="/src/evil")
        s.append(hostile, {"role": "user", "content": HOSTILE_TEXT})
        s.append(
            hostile,
            {"role": "assistant", "content": HOSTILE_TEXT, "thinking": HOSTILE_TEXT,
             "tool_calls": [{"id": '"><img src=x onerror=window.__pwned=1>',
                             "name": "<b onclick=window.__pwned=1>shell</b>",
                             "arguments": {"command": HOSTILE_TEXT}}]},
        )  # fmt: skip
        s.append(
            hostile,
            {"role": "tool", "tool_call_id": '"><img src=x onerror=window.__pwned=1>',
             "name": "shell", "content": HOSTILE_TEXT},
        )  # fmt: skip
        archived = s.new_session(title="An old experiment", root="/src/lab")
        s.append(archived, {"role": "user", "content": "hello from the archive"})
        s.archive(archived)
    return Demo(main, fork, hostile, archived, fork_node, result)
