"""A call's record as its producer knows it: one state, and only the moves a publish makes."""

from __future__ import annotations

import pytest

from dedupe.values.record_state import RecordState

ALL = list(RecordState)


def test_a_provisional_record_stands_where_the_producer_may_cancel_or_confirm_it() -> None:
    assert {state for state in ALL if state.provisional_written} == {
        RecordState.PROVISIONAL,
        RecordState.ASKED,
        RecordState.UNKNOWN,
        RecordState.AWAITING_CONFIRM,
        RecordState.UNROUTED,
    }


@pytest.mark.parametrize("state", ALL, ids=[state.name for state in ALL])
def test_a_record_may_stay_as_it_is(state: RecordState) -> None:
    assert state.to(state) is state


@pytest.mark.parametrize("state", [s for s in ALL if s is not RecordState.UNKNOWN])
def test_nothing_follows_a_write_of_unknown_fate(state: RecordState) -> None:
    with pytest.raises(AssertionError, match="from UNKNOWN to"):
        RecordState.UNKNOWN.to(state)


@pytest.mark.parametrize(
    "state", [s for s in ALL if s not in (RecordState.SENT, RecordState.QUEUED)]
)
def test_a_sent_publish_is_only_ever_answered_queued(state: RecordState) -> None:
    assert RecordState.SENT.to(RecordState.QUEUED) is RecordState.QUEUED
    with pytest.raises(AssertionError):
        RecordState.SENT.to(state)


def test_a_publish_never_takes_back_a_queued_record() -> None:
    for state in ALL:
        if state is not RecordState.QUEUED:
            with pytest.raises(AssertionError):
                RecordState.QUEUED.to(state)


def test_only_a_provisional_record_of_a_message_not_out_sent_nowhere_or_unread_is_freed() -> None:
    freed = {state for state in ALL if state is not RecordState.ABSENT and _can(state, "ABSENT")}
    assert freed == {
        RecordState.PROVISIONAL,
        RecordState.ASKED,
        RecordState.AWAITING_CONFIRM,
        RecordState.UNROUTED,
    }


def _can(state: RecordState, name: str) -> bool:
    try:
        state.to(RecordState[name])
    except AssertionError:
        return False
    return True
