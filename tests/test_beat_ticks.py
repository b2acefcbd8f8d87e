"""Which tick a beat send belongs to: the same name in every beat that fires for it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.schedules import crontab, schedule, solar
from hypothesis import given
from hypothesis import strategies as st

from dedupe.beat.ticks import tick_of

UTC = dt.timezone.utc
# Crontab and solar schedules read their clock in their app's timezone: without an app of
# their own they take the current app's, which another test may have set.
UTC_APP = Celery("ticks", set_as_current=False)
UTC_APP.conf.timezone = "UTC"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


def clock(at: dt.datetime) -> Callable[[], dt.datetime]:
    return lambda: at


def at_unix(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, UTC)


def test_an_interval_tick_is_the_intervals_slot_on_the_epoch_clock() -> None:
    early = tick_of(schedule(10.0, nowfun=clock(at_unix(1_000_000.1))))
    late = tick_of(schedule(10.0, nowfun=clock(at_unix(1_000_009.9))))
    next_slot = tick_of(schedule(10.0, nowfun=clock(at_unix(1_000_010.0))))
    assert early is not None
    assert late is not None
    assert next_slot is not None
    assert early.number == late.number == 100_000
    assert next_slot.number == 100_001


@given(
    start_us=st.integers(min_value=10**15, max_value=2 * 10**15),
    every_us=st.integers(min_value=50_000, max_value=86_400 * 10**6),
    lateness_us=st.lists(st.integers(min_value=0, max_value=5 * 10**6), min_size=1, max_size=20),
)
def test_one_beats_sends_of_an_interval_never_share_a_tick(
    start_us: int, every_us: int, lateness_us: list[int]
) -> None:
    # A lone beat sends at least an interval apart (late, never early): each send must claim
    # a tick of its own, or that beat would skip its own ticks.
    every = dt.timedelta(microseconds=every_us)
    sends = [EPOCH + dt.timedelta(microseconds=start_us)]
    for late in lateness_us:
        sends.append(sends[-1] + every + dt.timedelta(microseconds=late))
    ticks = [tick_of(schedule(every, nowfun=clock(t))) for t in sends]
    numbers = [tick.number for tick in ticks if tick is not None]
    assert len(numbers) == len(sends)
    assert len(set(numbers)) == len(numbers)


@given(
    slot=st.integers(min_value=10**8, max_value=2 * 10**8),
    phases=st.lists(st.floats(min_value=0.0, max_value=0.999), min_size=2, max_size=5),
)
def test_beats_at_any_phase_inside_one_interval_name_one_tick(
    slot: int, phases: list[float]
) -> None:
    every = 10.0
    ticks = {
        tick.number
        for phase in phases
        if (tick := tick_of(schedule(every, nowfun=clock(at_unix((slot + phase) * every)))))
    }
    assert ticks == {slot}


def test_an_interval_claim_outlives_the_beats_of_its_tick() -> None:
    tick = tick_of(schedule(30.0, nowfun=clock(at_unix(1_000_000.0))))
    assert tick is not None
    assert tick.ttl_ms >= 2 * 30_000


def test_crontab_beats_firing_for_one_occurrence_name_one_tick() -> None:
    every_minute = [
        crontab(
            minute="*",
            nowfun=clock(dt.datetime(2026, 11, 24, 9, 0, s, us, tzinfo=UTC)),
            app=UTC_APP,
        )
        for s, us in ((0, 50_000), (0, 900_000), (7, 0))
    ]
    ticks = {tick.number for s in every_minute if (tick := tick_of(s))}
    assert ticks == {int(dt.datetime(2026, 11, 24, 9, 1, tzinfo=UTC).timestamp() * 1000)}


def test_the_next_crontab_occurrence_is_another_tick() -> None:
    nine = tick_of(
        crontab(
            minute="*", nowfun=clock(dt.datetime(2026, 11, 24, 9, 0, 1, tzinfo=UTC)), app=UTC_APP
        )
    )
    one_past = tick_of(
        crontab(
            minute="*", nowfun=clock(dt.datetime(2026, 11, 24, 9, 1, 1, tzinfo=UTC)), app=UTC_APP
        )
    )
    assert nine is not None
    assert one_past is not None
    assert one_past.number - nine.number == 60_000


def test_a_daily_crontab_claim_outlives_the_day() -> None:
    tick = tick_of(
        crontab(
            hour=3,
            minute=0,
            nowfun=clock(dt.datetime(2026, 11, 24, 3, 0, 2, tzinfo=UTC)),
            app=UTC_APP,
        )
    )
    assert tick is not None
    assert tick.ttl_ms >= 24 * 3600 * 1000


def test_solar_beats_firing_for_one_event_name_one_tick() -> None:
    def sunset(seconds_after: float) -> Any:
        # 2026-11-24 sunset in Amsterdam is about 15:33 UTC: fire just after it.
        at = dt.datetime(2026, 11, 24, 15, 40, tzinfo=UTC) + dt.timedelta(seconds=seconds_after)
        return solar("sunset", 52.37, 4.90, nowfun=clock(at), app=UTC_APP)

    first, second = tick_of(sunset(0)), tick_of(sunset(30))
    assert first is not None
    assert second is not None
    assert first.number == second.number
    next_day = dt.datetime.fromtimestamp(first.number / 1000, UTC)
    assert next_day.date() == dt.date(2026, 11, 25)


def test_a_schedule_that_cannot_estimate_sends_unclaimed() -> None:
    class Opaque:
        def now(self) -> dt.datetime:
            return dt.datetime.now(UTC)

    assert tick_of(Opaque()) is None
