"""The record format: how owners are packed, and what a Holder reads back (pure functions)."""

from __future__ import annotations

import re
import time
import uuid

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dedupe import RecordFormatError
from dedupe.values.record import Holder, pack_owner, pack_queued, pack_running, unpack_owner

# Any text a task id could be: Celery's UUIDs, near-misses of them, anything else.
uuid_texts = st.uuids().map(str)
task_ids = st.one_of(
    uuid_texts,
    uuid_texts.map(str.upper),
    uuid_texts.map(lambda text: text.replace("-", "")),
    uuid_texts.map(lambda text: text[:8] + " " + text[9:]),
    st.text(),
    st.text(alphabet="0123456789abcdef-", min_size=36, max_size=36),
    # A UUID's dashes where they belong, and more dashes among the digits.
    st.text(alphabet="0-", min_size=32, max_size=32).map(
        lambda t: f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:]}"[:36]
    ),
)


@given(task_ids)
def test_an_owner_gives_back_its_task_id(task_id: str) -> None:
    assert unpack_owner(pack_owner(task_id)) == task_id


@given(task_ids, task_ids)
def test_two_task_ids_never_share_an_owner(first: str, second: str) -> None:
    if first != second:
        assert pack_owner(first) != pack_owner(second)


@given(st.uuids())
def test_a_uuid_in_its_usual_text_form_packs_to_17_bytes(value: uuid.UUID) -> None:
    assert pack_owner(str(value)) == b"\xff" + value.bytes


def test_a_uuid_shaped_id_with_extra_dashes_is_kept_as_text() -> None:
    first = "00000000-0000-0000-0000-00000000--00"
    second = "00000000-0000-0000-0000-0000000000--"
    assert pack_owner(first) == first.encode()
    assert pack_owner(second) == second.encode()


def test_a_task_id_with_lone_surrogates_still_round_trips() -> None:
    assert unpack_owner(pack_owner("job-\udc80")) == "job-\udc80"


def test_a_queued_record_reads_back_as_a_queued_holder() -> None:
    task_id, now = str(uuid.uuid4()), time.time()
    holder = Holder.from_raw("k", pack_queued(task_id, now, now + 90.5), 60_000)
    assert holder == Holder("k", task_id, "queued", 60.0, now, now + 90.5)


def test_a_running_record_reads_back_as_a_running_holder() -> None:
    task_id, now = str(uuid.uuid4()), time.time()
    raw = pack_running(task_id, "0123456789ab", "worker-1.example", 4_000_000, now)
    holder = Holder.from_raw("k", raw, 1_500)
    assert holder == Holder(
        "k",
        task_id,
        "running",
        1.5,
        started_at=int(now),
        worker="worker-1.example:4000000",
        run_token="0123456789ab",
    )


def test_a_running_record_with_its_lease_inside_reads_back_as_a_running_holder() -> None:
    # As claim.lua writes it for a run whose message the broker would deliver again.
    task_id = str(uuid.uuid4())
    fields = (pack_owner(task_id), "0123456789ab", "worker-1.example", 42, 1_700_000_000)
    raw = msgpack.packb((*fields, 1_700_000_060), use_bin_type=False)
    holder = Holder.from_raw("k", raw, 3_600_000)
    assert holder == Holder(
        "k",
        task_id,
        "running",
        3600.0,
        started_at=1_700_000_000,
        worker="worker-1.example:42",
        run_token="0123456789ab",
    )


def test_a_key_without_a_ttl_reads_as_an_unknown_ttl() -> None:
    assert Holder.from_raw("k", pack_queued("A", 0.0, None), -1).ttl is None


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb({"i": "A", "s": "q", "q": 1.0}),  # a map, as 0.1.0 wrote records
        msgpack.packb(["A"]),
        msgpack.packb(["A", 1.0, 2, 3]),
        msgpack.packb([1, 1.0]),
        msgpack.packb("A"),
        msgpack.packb([b"A", b"x"]),
        msgpack.packb([b"A", 1.0, "soon"]),
        msgpack.packb([b"A", b"t", b"host", b"7", 1]),
        msgpack.packb([b"A", b"t", b"host", 7.5, 1]),
        msgpack.packb([b"A", b"t", b"host", True, 1]),
        msgpack.packb([b"A", b"t", b"host", 7, 1, "soon"]),
        msgpack.packb([b"\xfe", 1.0]),
        b"plain text",
        b"",
    ],
    ids=[
        "old map",
        "one field",
        "four fields",
        "numeric owner",
        "a string",
        "text enqueue time",
        "text eta",
        "text pid",
        "float pid",
        "boolean pid",
        "text lease end",
        "owner not utf-8",
        "text",
        "empty",
    ],
)
def test_a_value_that_is_no_record_raises_a_clear_error_naming_its_key(raw: bytes) -> None:
    expected = re.escape("dedupe:{x:1} holds no celery-dedupe record")
    with pytest.raises(RecordFormatError, match=expected):
        Holder.from_raw("dedupe:{x:1}", raw, 1_000)
