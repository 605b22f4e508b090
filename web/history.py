"""Whether a node is in a session's history, and how far back.

An address such as ``/s/<session>/at/<node>`` names a session and a node
apart, and a form posts a node id for a session: the page and the action
take the node only if the session's head reaches it by parent links, so a
message of another session is never shown, tagged or forked under this
one's title.
"""

from __future__ import annotations

from objstore import InvalidInput, ObjectError, SessionInfo, Store, UnknownSpec


def steps_back(handle: Store, head: str | None, node_id: str) -> int | None:
    """How many parent links lead from ``head`` back to ``node_id``; None if none do.

    It walks from the head and stops at the node, so a node near the head costs a
    few reads (a fork or a tag at a recent message). A node's message count never
    grows going back, so the walk also stops once it is below the node's: a node
    of another session costs no more than the distance to where it would be.
    """
    try:
        wanted = handle.node(node_id).messages
    except ObjectError:  # no such object, or not a node
        return None
    at, steps = head, 0
    while at is not None:
        if at == node_id:
            return steps
        node = handle.node(at)
        if node.messages < wanted:
            return None
        at, steps = node.parent, steps + 1
    return None


def node_shown(handle: Store, info: SessionInfo, node_id: str) -> None:
    """UnknownSpec (a 404) unless ``node_id`` is in the history of ``info``'s session."""
    if steps_back(handle, info.head, node_id) is None:
        raise UnknownSpec(f"session {info.id[:12]} has no message {node_id[:12]}")


def steps_to(handle: Store, sid: str, node_id: str) -> int:
    """How far ``node_id`` is behind the head of ``sid``, for a change asked at it;
    InvalidInput (a refusal) if it is not in that session's history."""
    steps = steps_back(handle, handle.session(sid).head, node_id)
    if steps is None:
        raise InvalidInput(f"node {node_id[:12]} is not in the history of session {sid[:12]}")
    return steps
