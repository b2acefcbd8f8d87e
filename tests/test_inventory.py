"""Reading keys back to their task: the exact inverse of how keys.call_keys names them."""

from __future__ import annotations

import redis
from hypothesis import given
from hypothesis import strategies as st

from dedupe.runs.inventory import scan, scan_page, task_of_key
from dedupe.values.keys import call_keys
from dedupe.values.record import pack_queued

from .conftest import RedisFactory

DIGEST = "0123456789abcdef0123456789abcdef"
names = st.text(min_size=1)
prefixes = st.text(min_size=1)


@given(prefixes, names)
def test_a_calls_keys_read_back_to_exactly_its_task_name(prefix: str, name: str) -> None:
    keys = call_keys(prefix, name, DIGEST, separate_run_lock=True)
    assert task_of_key(prefix, keys.call) == name
    assert task_of_key(prefix, keys.run) == name


@given(prefixes, names, names)
def test_a_key_of_another_task_never_reads_as_this_one(prefix: str, name: str, other: str) -> None:
    keys = call_keys(prefix, other, DIGEST, separate_run_lock=False)
    assert (task_of_key(prefix, keys.call) == name) == (name == other)


def test_a_key_of_another_prefix_or_program_reads_as_no_task() -> None:
    assert task_of_key("dedupe", f"other:{{jobs:{DIGEST}}}") is None
    assert task_of_key("dedupe", "dedupe:{jobs:1}") is None
    assert task_of_key("dedupe", f"dedupe:{{jobs:{DIGEST}") is None


def test_the_keys_of_flow_control_beside_a_record_are_not_listed_and_break_nothing(
    redis_factory: RedisFactory,
) -> None:
    # A debounced call's latest-arguments hash, a limited key's line and slots: not records,
    # and not strings (a GET of one is refused with WRONGTYPE).
    client = redis.Redis.from_url(redis_factory().url)
    record = call_keys("inv", "jobs", DIGEST, separate_run_lock=False).call
    client.set(record, pack_queued("t", 0.0, None))
    client.hset(f"{record}:latest", "owner", "arguments")
    client.zadd(f"{record}:line", {"t": 1})
    client.zadd(f"{record}:slots", {"t": 1})
    assert [key for key, _, _ in scan(client, "inv")] == [record]
    assert [key for key, _, _ in scan(client, "inv", "jobs")] == [record]
    cursor, page = 0, []
    while True:
        cursor, found = scan_page(client, "inv", None, cursor, 10)
        page += [key for key, _, _ in found]
        if not cursor:
            break
    assert page == [record]
    client.close()
