"""``ags push`` and ``ags pull`` killed with SIGKILL at random points against a real
SeaweedFS: no remote ref names an object the remote lacks, no tracking ref names an
object the store lacks, and running the command again finishes the job."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from s3_server import S3Server, aws_env_fixture, s3_env_fixture, seaweedfs_fixture  # noqa: F401
from sync_setup import new_store, remote_is_consistent, s3_remote, sessions_with

from objstore import Store
from objstore.reach import reachable

SESSIONS = 60
MESSAGES = 60


def run_ags(store: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "--store", str(store), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
        env=os.environ.copy(),
    )


def killed_at_random(store: Path, *args: str, seed: int) -> bool:
    """Run ags and SIGKILL it at a random moment; True if it died before finishing."""
    proc = run_ags(store, *args)
    # Within 1.5 s: the first push of the test's sessions ended before 2.6 s on a
    # quiet machine (CI, once: no kill landed), and a kill after it lands on nothing.
    time.sleep(random.Random(seed).uniform(0.3, 1.5))
    finished = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return not finished


def test_a_push_killed_anywhere_leaves_the_remote_consistent(
    tmp_path: Path, s3_env: S3Server
) -> None:
    location = s3_remote(s3_env)
    with new_store(tmp_path / "a", location) as a:
        sessions_with(a, SESSIONS, MESSAGES, " " + "x" * 200)
    died = 0
    for round_ in range(4):
        if killed_at_random(tmp_path / "a", "push", "--all", seed=round_):
            died += 1
        remote_is_consistent(location, tmp_path / f"check{round_}")
        with Store.open(tmp_path / "a") as a:  # and the next round has something new
            for sid in list(a.tracking_refs("origin"))[:3]:
                a.append(sid, {"role": "user", "content": f"round {round_}"})
    assert died >= 1  # some kills landed mid-push
    finish = run_ags(tmp_path / "a", "push", "--all")
    assert finish.wait(300) == 0, finish.stderr.read() if finish.stderr else ""
    targets = remote_is_consistent(location, tmp_path / "final")
    with Store.open(tmp_path / "a") as a:
        local = {f"sessions/{s.id}": s.head for s in a.sessions()}
    assert targets == local


def test_a_pull_killed_anywhere_leaves_the_store_consistent(
    tmp_path: Path, s3_env: S3Server
) -> None:
    location = s3_remote(s3_env)
    with new_store(tmp_path / "a", location) as a:
        sessions_with(a, SESSIONS, MESSAGES, " " + "y" * 200)
    assert run_ags(tmp_path / "a", "push", "--all").wait(300) == 0
    new_store(tmp_path / "b", location).close()
    for round_ in range(3):
        killed_at_random(tmp_path / "b", "pull", seed=100 + round_)
        with Store.open(tmp_path / "b") as b:
            for rec in b.tracking_refs("origin").values():
                assert rec.target is not None
                reachable([rec.target], b.node, skip_missing=False)  # all here
            for info in b.sessions():
                if info.head:
                    reachable([info.head], b.node, skip_missing=False)
    assert run_ags(tmp_path / "b", "pull").wait(300) == 0
    with Store.open(tmp_path / "a") as a, Store.open(tmp_path / "b") as b:
        assert {s.id: s.head for s in a.sessions()} == {s.id: s.head for s in b.sessions()}
