"""Sixteen processes race one compare-and-swap, round after round, on a real SeaweedFS
and in a real directory: every round exactly one wins, and the key holds its value."""

from __future__ import annotations

import multiprocessing
import os
import queue
from pathlib import Path
from typing import Any

import pytest
from s3_server import S3Server, aws_env_fixture, s3_env_fixture, seaweedfs_fixture  # noqa: F401

from objstore.remote import RemoteLocation, SwapFailed, open_storage

RACERS = 16
KEY = "refs/sessions/race"


def racer(location: RemoteLocation, rounds: int, me: int, barrier: Any, results: Any) -> None:
    """One process: each round, read the cell with everyone, then swap with everyone."""
    with open_storage(location) as storage:
        for round_ in range(rounds):
            barrier.wait()
            cell = storage.read_cell(KEY)
            barrier.wait()  # all have read before anyone writes
            try:
                storage.swap(cell, {"round": round_, "winner": me})
                won = True
            except SwapFailed:
                won = False
            results.put((round_, me, cell.generation, won))


def race(location: RemoteLocation, rounds: int) -> list[tuple[int, int, int, bool]]:
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no shared client state
    barrier = ctx.Barrier(RACERS, timeout=120)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=racer, args=(location, rounds, i, barrier, results))
        for i in range(RACERS)
    ]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in range(RACERS * rounds):
            got.append(results.get(timeout=180))
    except queue.Empty:
        pytest.fail(f"the racers stopped after {len(got)} swaps")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    assert all(p.exitcode == 0 for p in procs)
    return got


def assert_one_winner_per_round(location: RemoteLocation, rounds: int) -> None:
    results = race(location, rounds)
    for round_ in range(rounds):
        this = [r for r in results if r[0] == round_]
        assert len(this) == RACERS
        assert {generation for _, _, generation, _ in this} == {round_}  # all read the same
        winners = [me for _, me, _, won in this if won]
        assert len(winners) == 1, f"round {round_}: winners {winners}"
    with open_storage(location) as storage:
        final = storage.read_cell(KEY)
    last_winner = next(me for r, me, _, won in results if r == rounds - 1 and won)
    assert final.generation == rounds
    assert final.value == {"round": rounds - 1, "winner": last_winner}


def test_sixteen_processes_race_one_swap_on_seaweedfs(s3_env: S3Server) -> None:
    bucket = s3_env.new_bucket()
    assert_one_winner_per_round(RemoteLocation(f"s3://{bucket}/race", s3_env.endpoint), 10)


def test_sixteen_processes_race_one_swap_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "remote").mkdir()
    assert_one_winner_per_round(RemoteLocation(os.fspath(tmp_path / "remote")), 20)
