"""Which scheduled tick of an entry a send belongs to, the same in every beat process.

Beat processes side by side each keep their own schedule: an interval entry fires in each at
its own phase, so "the previous run is over" alone lets every beat send a short task once per
interval. A tick claim makes the sends of one tick one send: the first beat to claim
``(entry, tick)`` sends, the others skip that tick.

A tick must name the same moment in every beat (how, per kind of schedule, is in the design
notes: docs/design-notes.md, "dedupe.beat.ticks").
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from celery.schedules import schedule as interval_schedule

__all__ = ["Tick", "tick_of"]


@dataclass(frozen=True, slots=True)
class Tick:
    """One tick of an entry: its name in keys, and how long its claim must live."""

    #: The slot number of an interval, else the next occurrence in unix milliseconds.
    number: int
    #: Milliseconds the claim lives: past the moment every beat has fired for this tick.
    ttl_ms: int
    #: Intervals only: the slot after this one. A beat that finds its own claim on this
    #: slot sends the entry a whole interval after its last send (Celery found it due), a
    #: hair inside the same slot: that send is the next slot's.
    following: int | None = None


def tick_of(schedule: Any) -> Tick | None:
    """The tick that a send now of an entry on ``schedule`` belongs to, read on the
    schedule's own clock (``schedule.now()``, the app's clock unless the schedule has its
    own ``nowfun``).

    None when the schedule cannot say (a custom schedule without ``remaining_estimate``):
    the send goes ahead unclaimed, as a plain beat's would.

    >>> at = lambda: dt.datetime.fromtimestamp(1_000_004.2, dt.timezone.utc)
    >>> tick_of(interval_schedule(10.0, nowfun=at))
    Tick(number=100000, ttl_ms=30000, following=100001)
    """
    try:
        moment = schedule.now()
    except Exception:  # a schedule without a clock of its own: the process's clock
        moment = None
    if not isinstance(moment, dt.datetime):
        moment = dt.datetime.now(dt.timezone.utc)
    if isinstance(schedule, interval_schedule):
        # Whole microseconds: float division would put two sends exactly an interval apart
        # into one slot now and then.
        every: dt.timedelta = getattr(schedule, "run_every", dt.timedelta(0))
        if every <= _NO_TIME:
            return None
        slot = _since_epoch(moment) // every
        return Tick(slot, _ttl_ms(every.total_seconds()), following=slot + 1)
    try:
        remaining = schedule.remaining_estimate(moment)
    except Exception:  # a schedule that cannot estimate: its sends go unclaimed
        return None
    if not isinstance(remaining, dt.timedelta):
        return None
    seconds = max(remaining.total_seconds(), 0.0)
    return Tick(round((moment.timestamp() + seconds) * 1000), _ttl_ms(seconds))


_NO_TIME = dt.timedelta(0)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _since_epoch(moment: dt.datetime) -> dt.timedelta:
    if moment.tzinfo is None:  # a naive clock reads local time, as datetime.timestamp() does
        moment = moment.astimezone()
    return moment - _EPOCH


def _ttl_ms(interval: float) -> int:
    # Every beat that names this tick fires within one interval of the first (a later fire
    # names a later tick): two intervals, plus room for the clocks of beat hosts to differ.
    return math.ceil((2 * interval + _CLOCK_SKEW) * 1000)


#: Seconds the clocks of two beat hosts may differ by (NTP keeps them far closer).
_CLOCK_SKEW = 10.0
