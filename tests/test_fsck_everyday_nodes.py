"""fsck takes the nodes ags writes apart with one regular expression (the everyday
shape, fsck_read._EVERYDAY_NODE) and parses every other node: damage in a node of
that shape is found as in any other, and a node that only nearly has the shape is
read as every reader reads it."""

from __future__ import annotations

from pathlib import Path

from hand_packs import node_object, object_id, write_pack

from objstore import Store, canonical, check_store
from objstore.fsck_read import _EVERYDAY_NODE
from objstore.nodes import Span, node_body, parse_node

TIME = {"time": "2026-12-01T08:51:13.259Z"}  # the meta of every node an append writes


def _store(path: Path) -> tuple[str, str, str]:
    """A session of 40 messages (a span among its nodes): its id, a message node deep in its
    chain and that node's message."""
    with Store.open(path) as s, s.batch():
        sid = s.new_session(title="a")
        for i in range(40):
            s.append(sid, {"role": "user", "content": f"a {i} " + "x" * 300})
    with Store.open(path) as s:
        real = list(s.log(sid))[3].node
    return sid, real.id, real.content


def test_every_node_an_append_writes_has_the_everyday_shape(tmp_path: Path) -> None:
    sid, _, _ = _store(tmp_path / "store")
    with Store.open(tmp_path / "store") as s:
        nodes = [entry.node for entry in s.log(sid)]
        bodies = [s.objects.get(node.id)[1] for node in nodes]
    assert len(nodes) == 40 and any(node.span is not None for node in nodes)
    assert all(_EVERYDAY_NODE.fullmatch(b"node\0" + body) for body in bodies)


def test_fsck_finds_damage_in_nodes_of_the_everyday_shape(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _, real_node, message = _store(path)
    missing = "ab" * 32
    blob_body = canonical.dumps({"role": "user", "content": "fine"})
    blob = (object_id("blob", blob_body), b"blob\0" + blob_body)
    orphan = node_object(node_body("message", missing, blob[0], None, 1, TIME))
    wrong_kind = node_object(node_body("message", None, real_node, None, 1, TIME))
    no_state = node_object(node_body("message", None, blob[0], missing, 1, TIME))
    bad_span = node_object(
        node_body("message", real_node, blob[0], None, 5, TIME, span=Span(None, (blob[0], message)))
    )
    span_after_missing = node_object(
        node_body("message", real_node, blob[0], None, 5, TIME, span=Span(missing, (blob[0],)))
    )
    crafted = [orphan, wrong_kind, no_state, bad_span, span_after_missing]
    assert all(_EVERYDAY_NODE.fullmatch(content) for _, content in crafted)
    # A pack each: links are checked by part, and a part is read again, node by node,
    # only if some link of it names what it must not; so each must be found alone.
    write_pack(path, [blob])
    for node in crafted:
        write_pack(path, [node])
    with Store.open(path) as s:
        problems = {str(p) for p in check_store(s).problems}
    assert problems == {
        f"{orphan[0]}: parent names missing {missing}",
        f"{wrong_kind[0]}: message names a node, not a blob",
        f"{no_state[0]}: state names missing {missing}",
        f"{bad_span[0]}: span does not match the messages before it",
        f"{span_after_missing[0]}: span.after names missing {missing}",
        f"{span_after_missing[0]}: span does not match the messages before it",
    }


def test_a_node_that_nearly_has_the_everyday_shape_is_read_as_parse_node_reads_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    _store(path)
    everyday = node_body("message", None, "cd" * 32, None, 1, TIME)
    near = {
        # Not JSON (a number with a leading zero): corrupt, as parse_node says.
        "leading zero": everyday.replace(b'"messages":1,', b'"messages":01,'),
        # JSON that parses, with a message id of upper-case digits: the same object.
        "upper case": everyday.replace(b"cd" * 32, b"CD" * 32),
        # An id one digit short: a link to nothing.
        "short id": everyday.replace(b"cd" * 32, b"cd" * 31 + b"c"),
    }
    nodes = {name: node_object(body) for name, body in near.items()}
    assert not any(_EVERYDAY_NODE.fullmatch(content) for _, content in nodes.values())
    write_pack(path, list(nodes.values()))
    with Store.open(path) as s:
        problems = {str(p) for p in check_store(s).problems}
    oid = nodes["leading zero"][0]
    try:
        parse_node(oid, near["leading zero"])
    except Exception as e:
        corrupt = f"{oid}: " + str(e).removeprefix(f"object {oid} ")
    assert corrupt in problems
    short = nodes["short id"][0]
    assert f"{short}: message names missing {'cd' * 31 + 'c'}" in problems
    upper = nodes["upper case"][0]
    assert f"{upper}: message names missing {'CD' * 32}" in problems
    assert len(problems) == 3


def test_fsck_checks_spans_over_nodes_read_in_a_row(tmp_path: Path) -> None:
    """A span over a session's nodes (read one after another, as written) is checked
    against them with a few comparisons; each kind of wrong list is still found."""
    path = tmp_path / "store"
    sid, _, _ = _store(path)
    with Store.open(path) as s:
        chain = [entry.node for entry in s.log(sid)][::-1]  # oldest first
    head, start = chain[20], chain[14]  # a span of the 6 nodes after ``start``, and its own
    between = [node.content for node in chain[15:21]]
    own = canonical.dumps({"role": "user", "content": "the span's own"})
    own_blob = (object_id("blob", own), b"blob\0" + own)

    def span_node(after: str | None, listed: list[str]) -> tuple[str, bytes]:
        span = Span(after, (*listed, own_blob[0]))
        return node_object(node_body("message", head.id, own_blob[0], None, 22, TIME, span=span))

    swapped = [*between]
    swapped[1], swapped[2] = swapped[2], swapped[1]
    spans = {
        "right": span_node(start.id, between),
        "swapped": span_node(start.id, swapped),
        "one short": span_node(start.id, between[1:]),
        "one more": span_node(chain[13].id, between),
        "after too near": span_node(chain[15].id, between),
        "from the root": span_node(None, between),
        # The walk stops at ``after``, here the session's first node, which it lists.
        "lists its after": span_node(chain[0].id, [node.content for node in chain[:21]]),
    }
    assert all(_EVERYDAY_NODE.fullmatch(content) for _, content in spans.values())
    write_pack(path, [own_blob, *spans.values()])
    with Store.open(path) as s:
        problems = {str(p) for p in check_store(s).problems}
    wrong = {oid for name, (oid, _) in spans.items() if name != "right"}
    assert problems == {f"{oid}: span does not match the messages before it" for oid in wrong}


def test_fsck_checks_spans_whose_nodes_lie_apart(tmp_path: Path) -> None:
    """A span over nodes written with another session's many nodes between them (its
    walk finds the next node neither just before nor anywhere known yet, waits, and
    goes on once a pass over every node placed it): a sound span passes, a wrong
    one is found."""
    path = tmp_path / "store"
    with Store.open(path) as s, s.batch():
        sid, other = s.new_session(title="a"), s.new_session(title="b")
        for i in range(10):
            s.append(sid, {"role": "user", "content": f"a {i}"})
        for i in range(150):  # more than the nodes a walk looks back over
            s.append(other, {"role": "user", "content": f"b {i}"})
        for i in range(10, 40):
            s.append(sid, {"role": "user", "content": f"a {i}"})
    with Store.open(path) as s:
        assert check_store(s).ok
        chain = [entry.node for entry in s.log(sid)][::-1]  # oldest first
    assert chain[31].span is not None and chain[31].span.after is None  # over the gap
    listed = [node.content for node in chain[:31]]
    listed[3], listed[25] = listed[25], listed[3]  # one message each side of the gap
    own = canonical.dumps({"role": "user", "content": "the span's own"})
    own_blob = (object_id("blob", own), b"blob\0" + own)
    wrong = node_object(
        node_body(
            "message",
            chain[30].id,
            own_blob[0],
            None,
            32,
            TIME,
            span=Span(None, (*listed, own_blob[0])),
        )
    )
    write_pack(path, [own_blob, wrong])
    with Store.open(path) as s:
        problems = [str(p) for p in check_store(s).problems]
    assert problems == [f"{wrong[0]}: span does not match the messages before it"]
