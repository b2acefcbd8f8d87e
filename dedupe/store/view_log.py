"""What the web view (``celery dedupe web``) keeps in the dedup Redis besides the records: its
switch, and per task a bounded stream of the last events and counts per minute of accepted
and deduplicated calls.

Nothing is written while the switch is off: the server sets it with a short TTL and renews
it while it runs, so a server that dies turns it off within that TTL. Every key written here
expires by itself (:data:`KEPT_FOR`): nothing outlives the view by long.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dedupe.values.keys import view_keys, view_task_keys

from .clients import DedupRedis
from .replies import decoded

__all__ = ["EVENTS_KEPT", "KEPT_FOR", "ViewLog"]

#: The most events kept per task (approximately: ``XADD MAXLEN ~`` trims in whole nodes).
EVENTS_KEPT = 200
#: Seconds an event stream, a minute's counts and the task set outlive their last write.
KEPT_FOR = 15 * 60

#: The counted events, and the field of a minute's hash that counts each.
COUNTED = {"call_accepted": "accepted", "call_deduplicated": "deduplicated"}


class ViewLog:
    """The web view's keys under one key prefix.

    .. code-block:: python

        log = ViewLog(client, "dedupe")
        log.switch_on(30.0)
        log.events("reports", 10)  # [{'event': 'call_accepted', 'task_id': '5b1f...', ...}]
    """

    def __init__(self, client: DedupRedis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.switch, self.tasks_key = view_keys(prefix)

    def switch_on(self, seconds: float, since: float = 0.0) -> None:
        """Turn the event log on for ``seconds`` (the server renews it well before), saying
        since when a view runs (epoch seconds): a process that looks later writes the events
        it made since then."""
        self.client.set(self.switch, f"{since:.3f}".encode(), px=max(1, round(seconds * 1000)))

    def switch_off(self) -> None:
        """Turn the event log off now (a server that stops cleanly)."""
        self.client.delete(self.switch)

    def is_on(self) -> bool:
        """Does a web view run (is the switch set)?"""
        return bool(self.client.exists(self.switch))

    def on_since(self) -> float | None:
        """Since when a web view runs (epoch seconds; 0.0: it does not say); None: none."""
        value = self.client.get(self.switch)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            return 0.0

    def record(self, task_name: str, fields: Mapping[str, str], at: float) -> None:
        """Add one event of ``task_name`` (``fields["event"]`` names it), and count it in its
        minute when it is an accepted or deduplicated call: one round trip."""
        events, minute = view_task_keys(self.prefix, task_name, int(at // 60))
        counted = COUNTED.get(fields.get("event", ""))
        with self.client.pipeline(transaction=False) as pipe:
            entry: dict[Any, Any] = dict(fields)
            pipe.xadd(events, entry, maxlen=EVENTS_KEPT, approximate=True)
            pipe.expire(events, KEPT_FOR)
            if counted is not None:
                pipe.hincrby(minute, counted, 1)
                pipe.expire(minute, KEPT_FOR)
            pipe.sadd(self.tasks_key, task_name)
            pipe.expire(self.tasks_key, KEPT_FOR)
            pipe.execute()

    def events(self, task_name: str, count: int) -> list[dict[str, str]]:
        """The last ``count`` events of ``task_name``, newest first."""
        events, _ = view_task_keys(self.prefix, task_name, 0)
        entries = self.client.xrevrange(events, count=count) or []
        return [_text(fields) for _, fields in entries if fields is not None]

    def tasks(self) -> list[str]:
        """The names of the tasks with events of late, sorted."""
        members = self.client.smembers(self.tasks_key)
        return sorted(decoded(member) for member in members)

    def minutes(
        self, task_names: Iterable[str], now: float, span: int
    ) -> dict[str, list[tuple[int, int, int]]]:
        """Per task, ``(minute, accepted, deduplicated)`` for each of the last ``span``
        minutes up to ``now``'s, oldest first (one round trip for them all)."""
        names = list(task_names)
        last = int(now // 60)
        wanted = [(name, minute) for name in names for minute in range(last - span + 1, last + 1)]
        with self.client.pipeline(transaction=False) as pipe:
            for name, minute in wanted:
                pipe.hgetall(view_task_keys(self.prefix, name, minute)[1])
            replies: list[dict[bytes, bytes]] = pipe.execute()
        counts: dict[str, list[tuple[int, int, int]]] = {name: [] for name in names}
        for (name, minute), reply in zip(wanted, replies, strict=True):
            counts[name].append(
                (minute, int(reply.get(b"accepted", 0)), int(reply.get(b"deduplicated", 0)))
            )
        return counts


def _text(fields: Mapping[Any, Any]) -> dict[str, str]:
    return {decoded(name): decoded(value) for name, value in fields.items()}
