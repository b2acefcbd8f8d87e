"""One thread's remembered answers (the table; the connection that hears Redis is
tests/test_remembered_duplicates.py's)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dedupe.store import remembered
from dedupe.store.remembered import RememberedAnswers


def _invalidate(*names: bytes | None) -> list[Any]:
    return [b"invalidate", None if names == (None,) else list(names)]


def test_an_answer_is_given_until_its_time_is_up() -> None:
    table = RememberedAnswers(remember_for=60.0)
    table.keep(b"k", time.monotonic() + 60.0, "holder")
    assert table.answer(b"k") == "holder"
    table.keep(b"k", time.monotonic() - 1.0, "holder")
    assert table.answer(b"k") is None
    assert not table


def test_no_answer_outlives_remember_for() -> None:
    table = RememberedAnswers(remember_for=0.0)
    table.keep(b"k", time.monotonic() + 60.0, "holder")
    assert table.answer(b"k") is None


def test_a_key_met_held_is_worth_tracking_but_has_no_answer() -> None:
    table = RememberedAnswers(remember_for=60.0)
    table.keep(b"k", time.monotonic() + 60.0, None)
    assert table.is_fresh(b"k")
    assert table.answer(b"k") is None


def test_an_invalidation_drops_the_keys_it_names() -> None:
    table = RememberedAnswers(remember_for=60.0)
    until = time.monotonic() + 60.0
    table.keep(b"a", until, "A")
    table.keep(b"b", until, "B")
    table.hear(_invalidate(b"a"))
    assert table.answer(b"a") is None
    assert table.answer(b"b") == "B"


def test_a_flush_drops_every_answer() -> None:
    table = RememberedAnswers(remember_for=60.0)
    table.keep(b"a", time.monotonic() + 60.0, "A")
    table.hear(_invalidate(None))
    assert not table


def test_a_push_that_is_no_invalidation_drops_nothing() -> None:
    table = RememberedAnswers(remember_for=60.0)
    table.keep(b"a", time.monotonic() + 60.0, "A")
    table.hear([b"message", b"channel", b"a"])
    assert table.answer(b"a") == "A"


def test_a_full_table_makes_room_by_dropping_expired_answers_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(remembered, "MOST_REMEMBERED", 2)
    table = RememberedAnswers(remember_for=60.0)
    table.keep(b"old", time.monotonic() - 1.0, "expired")
    table.keep(b"live", time.monotonic() + 60.0, "L")
    table.keep(b"new", time.monotonic() + 60.0, "N")
    assert (table.answer(b"live"), table.answer(b"new")) == ("L", "N")


def test_a_table_full_of_live_answers_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remembered, "MOST_REMEMBERED", 2)
    table = RememberedAnswers(remember_for=60.0)
    for name in (b"a", b"b", b"c"):
        table.keep(name, time.monotonic() + 60.0, name)
    assert (table.answer(b"a"), table.answer(b"b"), table.answer(b"c")) == (None, None, b"c")
