"""Threads appending through one shared Store while writes fail: what each got back."""

from __future__ import annotations

import threading

from objstore import Store


def append_in_threads(
    store: Store, sessions: list[str], count: int, refused: int
) -> tuple[dict[int, list[str]], list[int]]:
    """A thread per session appends ``count`` messages to it; returns the node ids each
    thread got back, in order, and how many of its appends raised an OSError of errno
    ``refused`` (any other error, or a thread that never ends, fails the test)."""
    acknowledged: dict[int, list[str]] = {t: [] for t in range(len(sessions))}
    failed = [0] * len(sessions)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        for i in range(count):
            try:
                node = store.append(sessions[t], {"role": "user", "content": f"{t} {i}"})
            except OSError as e:
                if e.errno != refused:
                    errors.append(e)
                failed[t] += 1
            else:
                acknowledged[t].append(node)

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(len(sessions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "an append waits for good"
    assert not errors, errors
    return acknowledged, failed
