"""``ags push``, ``fetch``, ``pull``, ``clone``: syncing a store with its remotes.

The logic lives in objstore/remote (push.py, fetch.py); this module picks the
remote, parses, calls and prints (a line per ref, ``--json`` for scripts,
progress on stderr when it is a terminal).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from objstore import InvalidName, RefConflict, SpecError, Store
from objstore.remote import (
    BadRemote,
    DamagedRemoteKey,
    FetchResult,
    PushResult,
    SessionPull,
    TransferStats,
    add_remote,
    delete_refs,
    fetch,
    open_storage,
    parse_location,
    pull,
    push,
    record_push,
    remote,
    remotes,
)

from .app import cli, open_store
from .output import counted, emit_json, short, visible


def _pick_remote(store: Store, name: str | None) -> str:
    """``name``, or ``origin``, or the only remote."""
    known = remotes(store)
    if name is not None:
        remote(store, name)  # BadRemote if unknown
        return name
    if "origin" in known:
        return "origin"
    if len(known) == 1:
        return next(iter(known))
    if not known:
        raise BadRemote("this store has no remote (ags remote add NAME URL)")
    raise BadRemote(f"name the remote: {', '.join(sorted(known))}")


def _progress(enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None

    def show(what: str, done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        click.echo(f"\r{what}: {done:,}/{total:,}", err=True, nl=False)
        if end:
            click.echo("", err=True)

    return show


def _stats(stats: TransferStats) -> dict[str, int]:
    return {
        "requests": stats.requests,
        "bytes_sent": stats.bytes_sent,
        "bytes_received": stats.bytes_received,
    }


def _push_refs(store: Store, specs: tuple[str, ...], everything: bool) -> list[str]:
    """The refs to push: every session and tag, the named ones (a tag by its name or
    ``tags/NAME``, a session by any spec that names one), or the session HEAD names."""
    if everything:
        return [n for n in store.ref_names() if n.startswith(("sessions/", "tags/"))]
    if not specs:
        try:
            return [f"sessions/{store.session_id('HEAD')}"]
        except SpecError:
            raise BadRemote("name the sessions or tags to push, or use --all") from None
    refs = []
    for spec in specs:
        tag = f"tags/{spec.removeprefix('tags/')}"
        try:
            is_tag = not spec.startswith("sessions/") and store.read_ref(tag) is not None
        except InvalidName:  # no tag name (a spec such as 3f2a~2): a session, or nothing
            is_tag = False
        refs.append(tag if is_tag else f"sessions/{store.session_id(spec)}")
    return list(dict.fromkeys(refs))


def _delete_refs(store: Store, name: str, specs: tuple[str, ...]) -> list[str]:
    """The remote refs to delete: ``tags/NAME``, or a session by its id or a prefix of
    one this store tracks on ``name`` or holds (it need not be here)."""
    if not specs:
        raise BadRemote("name the sessions or tags to delete on the remote")
    tracking = store.tracking_refs(name)
    refs = []
    for spec in specs:
        if spec.startswith("tags/"):
            refs.append(spec)  # delete_refs refuses what is no tag name
            continue
        try:
            refs.append(
                f"sessions/{_tracked(store, name, spec.removeprefix('sessions/'), tracking)}"
            )
        except SpecError:  # not here nor tracked: a whole id names it on the remote
            refs.append(f"sessions/{spec.removeprefix('sessions/')}")
    return list(dict.fromkeys(refs))


def _named_remote(
    store: Store, args: tuple[str, ...], everything: bool, *, pushing: bool = False
) -> tuple[str, tuple[str, ...]]:
    """The remote a push or pull names (first argument) or defaults to, and the rest.
    A first argument that names no remote while others follow it, or with --all, was
    meant as one: said so, with the remotes there are. A push's one argument alone that
    names neither a remote nor a session or tag here is said to be neither (a pull's
    may name a session only the remote has)."""
    known = remotes(store)
    if args and args[0] in known:
        return args[0], args[1:]
    meant_as_remote = everything or len(args) > 1
    # (a pull's one argument is not looked up: it may name a session only the remote has)
    if args and (meant_as_remote or pushing) and not _names_a_ref(store, args[0], known):
        names = ", ".join(sorted(known)) or "none (ags remote add NAME URL)"
        if meant_as_remote:
            raise BadRemote(f"no remote named {args[0]!r}; remotes: {names}")
        raise BadRemote(f"no remote, session or tag named {args[0]!r}; remotes: {names}")
    return _pick_remote(store, None), args


def _names_a_ref(store: Store, spec: str, known: dict[str, Any]) -> bool:
    """Whether ``spec`` names a session or tag here, or a session a remote has."""
    try:
        store.session_id(spec)
        return True
    except (SpecError, InvalidName):
        pass
    with contextlib.suppress(InvalidName):
        if store.read_ref(f"tags/{spec.removeprefix('tags/')}") is not None:
            return True
    return any(
        sid.startswith(spec.removeprefix("sessions/"))
        for name in known
        for sid in store.tracking_refs(name)
    )


@cli.command("push")
@click.argument("args", nargs=-1, metavar="[REMOTE] [SESSION|TAG ...]")
@click.option("--all", "everything", is_flag=True, help="Push every session and tag.")
@click.option("--force", is_flag=True, help="Overwrite a remote ref that is not an ancestor.")
@click.option(
    "--delete", "deleting", is_flag=True, help="Delete the named sessions or tags on the remote."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def push_cmd(
    ctx: click.Context,
    args: tuple[str, ...],
    everything: bool,
    force: bool,
    deleting: bool,
    as_json: bool,
) -> None:
    """Send sessions (and tags) to a remote: only the objects it lacks, as packs,
    then each ref by compare-and-swap. A ref the remote moved past yours is
    refused (ags pull first) unless --force. Without sessions, pushes the one
    HEAD names here; REMOTE defaults to origin (or the only remote).

    With --delete, deletes the named sessions or tags on the remote instead (a
    session's remote head must be one this store has seen, unless --force);
    local sessions are not touched, and ags gc --remote frees their objects.

    \b
    Examples:
      ags push                      # the checked-out session, to origin
      ags push origin 3f2a tags/v1
      ags push usb --all
      ags push origin 3f2a --force
      ags push --delete origin 3f2a
    """
    store = open_store(ctx)
    name, specs = _named_remote(store, args, everything, pushing=True)
    if everything and specs:
        raise BadRemote("--all pushes everything: name no sessions with it")
    if deleting and everything:
        raise BadRemote("--delete deletes the refs named: not with --all")
    refs = _delete_refs(store, name, specs) if deleting else _push_refs(store, specs, everything)
    with open_storage(remote(store, name)) as storage:
        if deleting:
            result = delete_refs(store, storage, refs, force=force)
        else:
            seen = store.tracking_refs(name)
            progress = _progress(not as_json)
            result = push(store, storage, refs, force=force, progress=progress, seen=seen)
        record_push(store, name, result)
        stats = _stats(storage.stats)
    _print_push(name, result, stats, as_json)
    if result.rejected:
        first = result.rejected[0]
        raise RefConflict(
            f"rejected {len(result.rejected)} of {len(result.refs)} refs ({first.ref}: {first.why})"
        )


def _print_push(name: str, result: PushResult, stats: dict[str, int], as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "remote": name,
                "refs": [
                    {"ref": r.ref, "old": r.old, "new": r.new, "outcome": r.outcome, "why": r.why}
                    for r in result.refs
                ],
                "objects": result.objects,
                "packs": result.packs,
                **stats,
            }
        )
        return
    for r in result.refs:
        why = f" ({r.why})" if r.why else ""
        click.echo(visible(f"{r.outcome:<12} {r.ref}  {short(r.old)} -> {short(r.new)}{why}"))
    click.echo(
        f"pushed to {name}: {counted(result.objects, 'object')} in "
        f"{counted(result.packs, 'pack')}, {counted(stats['requests'], 'request')}, "
        f"{counted(stats['bytes_sent'], 'byte')} sent"
    )


def _fetch_json(result: FetchResult) -> dict[str, Any]:
    return {
        "refs": [
            {"ref": r.ref, "old": r.old, "new": r.new, "outcome": r.outcome, "why": r.why}
            for r in result.refs
        ],
        "packs": result.packs,
        "objects": result.objects,
    }


def _ref_line(outcome: str, ref: str, old: str | None, new: str | None, why: str | None) -> str:
    if outcome == "damaged":
        return visible(f"{outcome:<12} {ref}  left out ({why})")
    return visible(f"{outcome:<12} {ref}  {short(old)} -> {short(new)}")


def _print_fetch(name: str, result: FetchResult) -> None:
    for r in result.refs:
        click.echo(_ref_line(r.outcome, r.ref, r.old, r.new, r.why))
    click.echo(
        f"fetched from {name}: {counted(result.objects, 'new object')} in "
        f"{counted(result.packs, 'pack')}"
    )


@cli.command("fetch")
@click.argument("name", required=False, metavar="[REMOTE]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def fetch_cmd(ctx: click.Context, name: str | None, as_json: bool) -> None:
    """Bring a remote's sessions here without touching yours: each remote head
    becomes remotes/REMOTE/SESSION, which resolves like any spec.

    \b
    Examples:
      ags fetch
      ags fetch usb --json
      ags log remotes/origin/3f2a
    """
    store = open_store(ctx)
    name = _pick_remote(store, name)
    with open_storage(remote(store, name)) as storage:
        result = fetch(store, storage, name, progress=_progress(not as_json), on_wait=_say_waiting)
        stats = _stats(storage.stats)
    if as_json:
        emit_json({"remote": name, **_fetch_json(result), **stats})
    else:
        _print_fetch(name, result)
    _fail_on_damage(name, result)


def _say_waiting() -> None:
    click.echo("ags: waiting for another fetch or pull into this store to finish", err=True)


def _fail_on_damage(name: str, result: FetchResult, pulled: Sequence[SessionPull] = ()) -> None:
    """Exit 1 once the rest is done if refs of the remote were left out as damaged."""
    damaged = {r.ref: r.why for r in result.refs if r.outcome == "damaged"}
    damaged |= {f"sessions/{p.session}": p.why for p in pulled if p.outcome == "damaged"}
    if damaged:
        refs = sorted(damaged)
        were = "was" if len(refs) == 1 else "were"
        raise DamagedRemoteKey(
            f"{counted(len(refs), 'ref')} of {name} {were} damaged and left out: "
            f"{', '.join(refs[:5])} (first: {damaged[refs[0]]})"
        )


def _print_fetch_damage(fetched: FetchResult, *, tags_only: bool = False) -> None:
    for r in fetched.refs:
        if r.outcome == "damaged" and not (tags_only and r.ref.startswith("sessions/")):
            click.echo(_ref_line(r.outcome, r.ref, r.old, r.new, r.why))


def _print_pull(fetched: FetchResult, pulled: list[SessionPull]) -> None:
    _print_fetch_damage(fetched, tags_only=True)  # a session's is its pull line
    for p in pulled:
        line = _ref_line(p.outcome, p.session, p.old, p.new, p.why)
        if p.meta:
            line += f"  (took {', '.join(p.meta)})"
        if p.kept:
            line += f"  (kept yours: {', '.join(p.kept)} changed on both sides)"
        click.echo(visible(line))


@cli.command("pull")
@click.argument("args", nargs=-1, metavar="[REMOTE] [SESSION ...]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def pull_cmd(ctx: click.Context, args: tuple[str, ...], as_json: bool) -> None:
    """Fetch, then fast-forward local sessions to the remote's (creating the ones
    this store lacks). A session that diverged is left as it is and named.
    Metadata (title, archived, model) the remote changed is taken; where both
    sides changed it since they last agreed, yours is kept and named.

    \b
    Examples:
      ags pull
      ags pull origin 3f2a
    """
    store = open_store(ctx)
    name, specs = _named_remote(store, args, False)
    with open_storage(remote(store, name)) as storage:
        sessions = None
        if specs:
            tracking = store.tracking_refs(name)
            sessions = [_tracked(store, name, spec, tracking) for spec in specs]
        fetched, pulled = pull(
            store, storage, name, sessions, progress=_progress(not as_json), on_wait=_say_waiting
        )
        stats = _stats(storage.stats)
    if as_json:
        emit_json(
            {
                "remote": name,
                "fetch": _fetch_json(fetched),
                "sessions": [
                    {
                        "session": p.session,
                        "old": p.old,
                        "new": p.new,
                        "outcome": p.outcome,
                        "meta": list(p.meta),
                        "kept": list(p.kept),
                        "why": p.why,
                    }
                    for p in pulled
                ],
                **stats,
            }
        )
    else:
        _print_pull(fetched, pulled)
    _fail_on_damage(name, fetched, pulled)
    diverged = [p.session for p in pulled if p.outcome == "diverged"]
    clashed = [f"{p.session} ({', '.join(p.kept)})" for p in pulled if p.kept]
    if clashed and not diverged:
        raise RefConflict(
            f"metadata changed here and on {name} since they last agreed; yours kept for "
            f"{', '.join(clashed[:5])} (ags push {name} sends yours)"
        )
    if diverged:
        left = "was left as it is" if len(diverged) == 1 else "were left as they are"
        raise RefConflict(
            f"{counted(len(diverged), 'session')} diverged from {name} and {left}: "
            f"{', '.join(diverged[:5])} (ags fork remotes/{name}/ID keeps both)"
        )


@contextlib.contextmanager
def _stopped_by(*signums: signal.Signals) -> Iterator[None]:
    """While inside, these signals end the command as an exception does (exit status
    128 + the signal's number, as a shell reports a process it killed), so that the
    code that cleans up after a failure runs: a clone killed by ``kill`` or a closed
    terminal removes what it made. SIGKILL cannot be caught; a clone killed by it
    leaves its folder."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    before = {signum: signal.signal(signum, stop) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _tracked(store: Store, name: str, spec: str, tracking: dict[str, Any]) -> str:
    """A session id from a full id or prefix of a local or a remote-tracked session."""
    matches = [sid for sid in tracking if sid.startswith(spec)]
    if len(matches) == 1:
        return matches[0]
    return store.session_id(spec)


@cli.command("clone")
@click.argument("url")
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option("--endpoint", help="The S3 server, for any but AWS: http(s)://host[:port].")
@click.option("--region", help="The bucket's region.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def clone_cmd(
    ctx: click.Context,
    url: str,
    directory: str | None,
    endpoint: str | None,
    region: str | None,
    as_json: bool,
) -> None:
    """Make a new store holding a remote's sessions, with the remote as origin.
    DIRECTORY defaults to the last part of the URL, in the current directory;
    it must not exist or be empty. A clone that fails leaves nothing behind; one
    that meets damaged refs leaves them out, keeps the rest and exits 1.

    \b
    Examples:
      ags clone s3://team-bucket/ags ~/team-ags
      ags clone /media/usb/ags
      ags clone s3://sessions lab --endpoint http://10.0.0.5:8333
    """
    location = parse_location(url, endpoint, region)
    where = Path(directory or location.url.rstrip("/").rsplit("/", 1)[-1]).absolute()
    if where.exists() and (not where.is_dir() or any(where.iterdir())):
        hint = ""
        if (where / "ags-store.json").is_file():  # a store (FORMAT.md 2): a clone killed?
            hint = f" (a store: if a clone there stopped, `ags --store {where} pull` finishes it)"
        raise BadRemote(f"{where} exists and is not an empty directory{hint}")
    made = not where.exists()
    mode = 0 if made else stat.S_IMODE(where.stat().st_mode)  # Store.open makes it 0700
    try:
        with (
            _stopped_by(signal.SIGTERM, signal.SIGHUP),
            Store.open(where) as store,
            open_storage(location) as storage,
        ):
            add_remote(store, "origin", location)
            fetched, pulled = pull(store, storage, "origin", progress=_progress(not as_json))
            stats = _stats(storage.stats)
    except BaseException:
        if made:
            shutil.rmtree(where, ignore_errors=True)
        else:
            for child in where.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
            os.chmod(where, mode)
        raise
    cloned = sum(p.outcome != "damaged" for p in pulled)
    if as_json:
        emit_json({"store": str(where), "fetch": _fetch_json(fetched), "sessions": cloned, **stats})
    else:
        _print_fetch_damage(fetched)
        click.echo(
            visible(
                f"cloned {location.url} into {where}: {counted(cloned, 'session')}, "
                f"{counted(fetched.objects, 'object')}"
            )
        )
    _fail_on_damage("origin", fetched)  # the clone keeps the rest
