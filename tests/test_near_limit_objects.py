"""An object near the size limit in a block pack (FORMAT.md 5.5): a writer gives it a
block of its own, so no block passes the bound older readers hold blocks to, and a
reader takes the blocks earlier writers made past that bound, heads and all.

Before, a message of nearly 128 MiB appended after almost a block's worth of others
went into their block, whose content then passed the bound every reader enforced by
the heads of the objects before it: the block read nowhere, and the session's
messages in it read as corrupt (``ags fsck``: 128 problems for 127 messages)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from cli.main import cli
from objstore import canonical, objects, packs
from objstore.limits import MAX_OBJECT_BYTES
from objstore.packs import WRITTEN_BLOCK_CONTENT, SealedPack, encode_block_pack
from objstore.store import Store

_ENVELOPE = len('{"content":"","role":"user"}')


def _messages() -> list[dict[str, str]]:
    """126 messages of 1,030 bytes of JSON (a block of 128 KiB less 1 KiB or so), then
    one whose JSON is the largest an object may hold."""
    small = [
        {"role": "user", "content": f"{i:04d}" + "y" * (1030 - _ENVELOPE - 4)} for i in range(126)
    ]
    return [*small, {"role": "user", "content": "x" * (MAX_OBJECT_BYTES - _ENVELOPE)}]


def _block_sizes(pack: SealedPack) -> list[int]:
    """The content size of every block of a block pack, each checked whole."""
    sizes = []
    for off in sorted({entry[1] for entry in pack._entries()}):
        checked = pack.checked_block(off)
        assert checked is not None, f"the block at {off} does not read"
        sizes.append(len(checked[0]))
    return sizes


def _written_and_read(store_path: Path) -> list[int]:
    """Append ``_messages`` to a new session, then read it back from a new handle, and
    check it whole and with fsck; the content sizes of the store's blocks."""
    messages = _messages()
    with Store.open(store_path) as store:
        sid = store.new_session()
        for message in messages:
            store.append(sid, message)
    with Store.open(store_path) as store:
        assert store.context(sid) == messages
        (pack,) = store.objects.sealed_packs()
        sizes = _block_sizes(pack)
    result = CliRunner().invoke(cli, ["--store", str(store_path), "fsck"])
    assert result.exit_code == 0 and result.stdout.endswith(": ok\n"), result.output
    return sizes


def test_a_near_limit_message_gets_a_block_of_its_own(tmp_path):
    sizes = _written_and_read(tmp_path / "s")
    assert max(sizes) <= WRITTEN_BLOCK_CONTENT
    assert any(size > MAX_OBJECT_BYTES for size in sizes)  # the big one, alone
    assert any(126 * 1030 < size < packs.BLOCK_BYTES + 8192 for size in sizes)  # the others


def test_a_block_an_earlier_writer_took_past_the_bound_reads(tmp_path, monkeypatch):
    # Earlier writers put the near-limit message in the others' block (and knew no
    # plain block of its own for a message over LARGE_CONTENT either).
    monkeypatch.setattr(packs, "ALONE_ABOVE", objects.MAX_CONTENT_BYTES)
    monkeypatch.setattr(packs, "LARGE_CONTENT", objects.MAX_CONTENT_BYTES)
    sizes = _written_and_read(tmp_path / "s")
    assert max(sizes) > WRITTEN_BLOCK_CONTENT  # past what older readers take, read here


def test_a_pushed_pack_keeps_its_blocks_within_the_bound(tmp_path):
    contents = []
    for message in _messages():
        content = objects.content_of("blob", canonical.dumps(message))
        contents.append((objects.content_id(content), content))
    pack_bytes, index = encode_block_pack(contents)
    (tmp_path / "pack-0.pack").write_bytes(pack_bytes)
    (tmp_path / "pack-0.idx").write_bytes(index)
    pack = SealedPack(tmp_path / "pack-0.pack")
    try:
        sizes = _block_sizes(pack)
        assert max(sizes) <= WRITTEN_BLOCK_CONTENT and len(sizes) == 2
        for oid, content in contents:
            assert pack.get(oid) == ("blob", content[5:])
    finally:
        pack.close()
