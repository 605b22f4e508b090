"""The stored form of an object (FORMAT.md 4): the uncompressed frames an append writes
for its nodes and journal records are zstd frames any reader takes, with their size."""

from __future__ import annotations

import os

import pytest
import zstandard

from objstore import LimitExceeded, objects
from objstore.limits import MAX_OBJECT_BYTES


@pytest.mark.parametrize(
    "size", [1, 250, 255, 256, 257, 65_791, 65_792, 131_067, 131_068, 131_072, 131_073, 300_000]
)
def test_a_raw_frame_gives_back_its_content_and_says_its_size(size: int) -> None:
    content = b"node\0" + os.urandom(size)
    stored = objects.stored_raw("node", content)
    assert stored[0] == objects.FORMAT_ZSTD
    assert zstandard.frame_content_size(stored[1:]) == len(content)
    assert zstandard.ZstdDecompressor().decompress(stored[1:]) == content
    assert objects.decode(objects.content_id(content), stored) == ("node", content[5:])


def test_a_raw_frame_over_the_object_limit_is_refused() -> None:
    with pytest.raises(LimitExceeded):
        objects.stored_raw("blob", b"blob\0" + bytes(MAX_OBJECT_BYTES + 1))
