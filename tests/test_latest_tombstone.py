"""The tombstone a debounced or replacing run leaves as it ends (end_latest.lua), and how the
take (take_latest.lua) answers a delivery of a run that ended: the store's contract, on a real
Redis. The worker's side is in tests/test_latest_redelivery.py."""

from __future__ import annotations

import time

import msgpack
import pytest

from dedupe.store.replies import Take
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.latest import Latest, LatestWrite, pack_arguments
from dedupe.values.record import pack_owner, pack_provisional, pack_queued

TTL_MS = 60_000
HORIZON_MS = 30_000


@pytest.fixture
def keys(request: pytest.FixtureRequest) -> CallKeys:
    key = f"tombstone:{{{request.node.name}}}"
    return CallKeys(key, f"{key}:run")


def taken_with_arguments(store: Store, keys: CallKeys, task_id: str) -> Latest:
    """``task_id`` holds the key; a duplicate left (7,); its run took them."""
    store.enqueue(keys, pack_queued(task_id, 0.0, None), TTL_MS)
    latest = LatestWrite(pack_arguments((7,), {}, "json"), time.time(), None, None)
    assert store.enqueue_latest(keys, pack_provisional("dup", 1), TTL_MS, latest) is not None
    taken = store.take_latest(keys, task_id, 0)
    assert isinstance(taken, Latest)
    return taken


def ended(store: Store, keys: CallKeys, task_id: str, retries: int, horizon_ms: int) -> None:
    store.send_end_latest(keys, task_id, retries, horizon_ms)
    store.flush()


def test_a_take_or_a_look_of_a_run_that_ended_answers_ended(store: Store, keys: CallKeys) -> None:
    taken_with_arguments(store, keys, "A")
    ended(store, keys, "A", 0, HORIZON_MS)
    assert store.take_latest(keys, "A", 0) is Take.ENDED
    assert store.take_latest(keys, "A", 0, now=time.time()) is Take.ENDED


def test_a_retry_of_a_run_that_ended_is_not_answered_ended(store: Store, keys: CallKeys) -> None:
    taken_with_arguments(store, keys, "A")
    ended(store, keys, "A", 0, HORIZON_MS)
    assert store.take_latest(keys, "A", 1) is None


def test_a_run_that_has_not_ended_takes_its_take_again(store: Store, keys: CallKeys) -> None:
    # (A run killed mid-run: its message, delivered again, runs with the burst's last arguments.)
    first = taken_with_arguments(store, keys, "A")
    assert store.take_latest(keys, "A", 0) == first


def test_the_tombstone_holds_no_arguments_and_lives_its_horizon(
    store: Store, keys: CallKeys
) -> None:
    taken_with_arguments(store, keys, "A")
    ended(store, keys, "A", 0, HORIZON_MS)
    assert not store.client.exists(keys.latest)  # (the take was the hash's last field)
    members = store.client.zrange(keys.ran, 0, -1)
    assert [msgpack.unpackb(member, raw=True) for member in members] == [[pack_owner("A"), 0]]
    assert 0 < store.client.pttl(keys.ran) <= HORIZON_MS


def test_a_lapsed_tombstone_answers_nothing_and_goes_as_the_next_run_ends(
    store: Store, keys: CallKeys
) -> None:
    ended(store, keys, "A", 0, 1)
    ended(store, keys, "B", 0, HORIZON_MS)  # (the set lives on, for B)
    time.sleep(0.01)  # (past A's 1 ms)
    assert store.take_latest(keys, "A", 0) is None
    ended(store, keys, "C", 0, HORIZON_MS)
    members = store.client.zrange(keys.ran, 0, -1)
    owners = {msgpack.unpackb(member, raw=True)[0] for member in members}
    assert owners == {pack_owner("B"), pack_owner("C")}
