"""The router's note of which worker stored each response: bounded, least recently used first out."""

from __future__ import annotations

from infera_core.server.response_owners import ResponseOwners, response_id_of


def test_the_least_recently_used_ids_go_first_and_the_map_stays_bounded() -> None:
    owners = ResponseOwners(max_entries=3)
    for i in range(3):
        owners.note(f"resp_{i}", f"w{i}", "m")
    assert owners.owner("resp_0") == ("w0", "m")  # used: now the newest
    owners.note("resp_3", "w3", "m")
    assert len(owners) == 3
    assert owners.owner("resp_1") is None  # the least recently used went
    assert [owners.owner(f"resp_{i}") for i in (0, 2, 3)] == [("w0", "m"), ("w2", "m"), ("w3", "m")]
    owners.forget("resp_2")
    assert owners.owner("resp_2") is None and len(owners) == 2


def test_the_id_of_an_answer_and_of_a_streams_first_event() -> None:
    assert (
        response_id_of(b'{"id": "resp_abc", "object": "response", "output": [{"id": "msg_1"}]}') == "resp_abc"
    )
    first = b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"resp_9"'
    assert response_id_of(first) == "resp_9"
    assert response_id_of(b"event: response.created\ndata: {") is None
