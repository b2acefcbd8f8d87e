"""``DedupeTask``: a Task base class whose calls and runs are deduplicated."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

from celery import Celery, signals
from celery.exceptions import Reject, Retry

from .errors import ConfigurationError
from .producer.aio import apublish_unique
from .producer.bulk import aapply_many, apply_many
from .producer.guard import Call, publish_unique
from .producer.limited_publish import publish_limited
from .producer.result import DedupeResult, mark_result
from .runs.run import run_of
from .runs.run_end import RunEnd
from .runs.runtime import installed
from .surfaces import AnyAsyncResult, AnyTask
from .values.header import HEADER
from .values.options import (
    CALL_OPTIONS,
    Until,
    check_call_names,
    check_declared,
    dedupes_every_call,
)
from .worker.release import end_of_body
from .worker.run_guard import guard, refuse_uninstalled

__all__ = ["DedupeTask"]

logger = logging.getLogger("dedupe.worker")

#: A request attribute: the task's body is running on it (a call of itself is a nested one).
_IN_BODY = "_dedupe_in_body"

#: What a call of a DedupeTask may pass next to Celery's options.
_CALL_OPTIONS = ("unique", *CALL_OPTIONS)


class DedupeTask(AnyTask):
    """Base class for tasks that must not be queued, or run, twice for the same arguments.

    ```python
    @app.task(base=DedupeTask, unique=True)        # every .delay() deduplicates
    def sync_customer(customer_id, full=False): ...

    @app.task(base=DedupeTask)                     # only delay_unique() does
    def report(day): ...

    report.delay_unique("2026-11-22").deduplicated  # False
    ```

    The class attributes below are the task options; every one, with its default and
    whether a call may give it too, is in the docs' Options page (docs/options.md).
    """

    #: Deduplicate every call (``delay``, ``apply_async``), not only the ``*_unique`` ones.
    unique: ClassVar[bool] = False
    #: The execution guard alone: two runs of the same arguments never overlap, calls are
    #: not deduplicated (the cookbook's lock recipe, done right).
    exclusive: ClassVar[bool] = False
    #: Only these arguments make calls the same (names of the task's parameters).
    unique_on: ClassVar[Sequence[str] | str | None] = None
    #: ``unique_key(*args, **kwargs)`` returns the value to deduplicate on.
    unique_key: ClassVar[Callable[..., object] | None] = None
    #: Seconds a queued record lives (plus any countdown): how long a lost message keeps
    #: its key. Default: ``dedupe_default_ttl`` (3600).
    unique_ttl: ClassVar[float | None] = None
    #: ``"finished"``: a call is a duplicate while another is queued or running.
    #: ``"started"``: only while another is queued; a call during a run queues behind it.
    #: ``"window"``: for ``unique_ttl`` after it was accepted, whether or not it ran (a
    #: throttle: "at most once an hour"); runs still never overlap.
    unique_until: ClassVar[Until | None] = None
    #: Seconds a run holds its key between heartbeats. Default: ``dedupe_default_lease`` (60).
    unique_lease: ClassVar[float | None] = None
    #: ``"return"`` the holder's result, ``"raise"`` ``AlreadyQueued``, or
    #: ``"replace"``: the holder's result, and while the holder is still queued its run takes
    #: this call's arguments (latest wins; with ``unique_until="started"`` calls made during a
    #: run leave one follow-up run, with the last call's arguments).
    on_duplicate: ClassVar[Literal["return", "raise", "replace"] | None] = None
    #: Seconds of quiet: calls of one key collapse into one run that starts this long after
    #: the last of them, with its arguments; every call gets the same task id.
    #: ``@app.task(base=DedupeTask, unique=True, debounce=5)``.
    debounce: ClassVar[float | None] = None
    #: With ``debounce``: the run starts at the latest this long after the burst's first
    #: call, however long the calls go on (at least ``debounce``).
    debounce_max_wait: ClassVar[float | None] = None
    #: When a run finds another run of its key live: ``"skip"`` it (its result is stored as
    #: REVOKED, naming the holder: ``.get()`` raises ``TaskRevokedError``) or ``"retry"`` it
    #: later. Canvas members, messages the producer accepted and ``unique_until`` "started"
    #: or "window" always retry; an ``exclusive`` task retries unless told to skip.
    on_running: ClassVar[Literal["skip", "retry"] | None] = None
    #: Seconds before a run that met a live run is tried again.
    on_running_countdown: ClassVar[float | None] = None

    #: At most this many runs of one key at once, across all workers; the other calls wait
    #: their turn, in call order (an int, or a callable of the call's arguments returning
    #: one). Every call is accepted: ``@app.task(base=DedupeTask, key_concurrency=2,
    #: unique_on=("tenant",))``.
    key_concurrency: ClassVar[int | Callable[..., int] | None] = None
    #: At most N starts of one key per period, across all workers (Celery's ``rate_limit``
    #: syntax: ``"2/s"``, ``"10/m"``, ``"100/h"``); a call beyond it is published with a
    #: countdown to the next free start. Every call is accepted.
    key_rate_limit: ClassVar[str | None] = None

    #: Marks a DedupeTask (values.options.GUARDS_RUNS): before_start calls the execution guard,
    #: and every option is read off its class.
    _dedupe_guards_runs: ClassVar[bool] = True
    #: Sends the run's claim as the worker accepts the message (a subclass of Celery's
    #: Request; a task that sets its own claims as its run starts).
    Request = "dedupe.worker.request:ClaimingRequest"

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Check the task's dedup options as Celery registers it: a misspelt or invalid one
        raises [`ConfigurationError`][dedupe.ConfigurationError] now, not at the first call."""
        super().on_bound(app)
        check_declared(cls, str(cls.name))

    def apply_async(
        self,
        args: Sequence[object] | None = None,
        kwargs: Mapping[str, object] | None = None,
        task_id: str | None = None,
        producer: object = None,
        link: object = None,
        link_error: object = None,
        shadow: str | None = None,
        **options: Any,
    ) -> DedupeResult:
        """Celery's apply_async; deduplicated when the task is ``unique`` or declares
        ``debounce`` or ``on_duplicate="replace"`` (or ``unique=True`` is passed), and then it
        also takes the call options of
        [`apply_async_unique`][dedupe.DedupeTask.apply_async_unique]."""
        unique = options.pop("unique", None)
        if options:
            check_call_names(self.name, options, _CALL_OPTIONS)
        options.update(
            task_id=task_id, producer=producer, link=link, link_error=link_error, shadow=shadow
        )
        if self._limited():
            if unique:
                raise ConfigurationError(_never_unique(self.name))
            return publish_limited(self._call(args, kwargs, options))
        if unique is None:
            # A message of ours sent again (a retry) keeps the key it carries.
            # A debounce or replace declared on the task makes every call of it unique.
            unique = dedupes_every_call(self) or HEADER in (options.get("headers") or {})
        if unique:
            return publish_unique(self._call(args, kwargs, options))
        stray = [name for name in CALL_OPTIONS if name in options]
        if stray:
            raise ConfigurationError(
                f"task {self.name!r}: {', '.join(stray)} only apply to deduplicated calls: "
                f"use apply_async_unique(...), pass unique=True, or declare the task unique=True"
            )
        return mark_result(self._dedupe_publish(args, kwargs, options), deduplicated=False)

    def delay(self, *args: object, **kwargs: object) -> DedupeResult:
        """Celery's ``delay``, typed as what
        [`apply_async`][dedupe.DedupeTask.apply_async] returns here."""
        return self.apply_async(args, kwargs)

    def apply_async_unique(
        self,
        args: Sequence[object] | None = None,
        kwargs: Mapping[str, object] | None = None,
        **options: object,
    ) -> DedupeResult:
        """Publish unless the same call is queued or running; see
        [`dedupe.apply_async`][dedupe.apply_async].

        ```python
        report.apply_async_unique(args=("2026-11-22",), countdown=10, unique_ttl=600)
        ```
        """
        options.pop("unique", None)
        check_call_names(self.name, options, _CALL_OPTIONS)
        if self._limited():
            raise ConfigurationError(_never_unique(self.name))
        return publish_unique(self._call(args, kwargs, options))

    def delay_unique(self, *args: object, **kwargs: object) -> DedupeResult:
        """``delay`` with dedup: ``report.delay_unique("2026-11-22")``."""
        return self.apply_async_unique(args, kwargs)

    def map_unique(
        self, arguments: Iterable[Sequence[object]], **options: Any
    ) -> list[DedupeResult]:
        """One call per tuple of positional arguments, all decided in one round trip; see
        [`dedupe.apply_many`][dedupe.apply_many].

        ```python
        results = report.map_unique([("2026-11-22",), ("2026-11-23",)], queue="reports")
        ```
        """
        options.pop("unique", None)
        if self._limited():
            raise ConfigurationError(_never_unique(self.name))
        return apply_many(self, [(args, {}) for args in arguments], **options)

    async def amap_unique(
        self, arguments: Iterable[Sequence[object]], **options: Any
    ) -> list[DedupeResult]:
        """[`map_unique`][dedupe.DedupeTask.map_unique] for asyncio code."""
        options.pop("unique", None)
        if self._limited():
            raise ConfigurationError(_never_unique(self.name))
        return await aapply_many(self, [(args, {}) for args in arguments], **options)

    async def aapply_async_unique(
        self,
        args: Sequence[object] | None = None,
        kwargs: Mapping[str, object] | None = None,
        **options: object,
    ) -> DedupeResult:
        """[`apply_async_unique`][dedupe.DedupeTask.apply_async_unique] for asyncio code: the
        Redis round trip is awaited.

        ```python
        result = await report.aapply_async_unique(args=("2026-11-22",))
        ```
        """
        options.pop("unique", None)
        if self._limited():
            raise ConfigurationError(_never_unique(self.name))
        return await apublish_unique(self._call(args, kwargs, options))

    async def adelay_unique(self, *args: object, **kwargs: object) -> DedupeResult:
        """[`delay_unique`][dedupe.DedupeTask.delay_unique] for asyncio code:
        ``await report.adelay_unique(day)``."""
        return await self.aapply_async_unique(args, kwargs)

    def _limited(self) -> bool:
        """The task has ``key_concurrency`` or ``key_rate_limit`` (read once, at definition)."""
        return self.key_concurrency is not None or self.key_rate_limit is not None

    def _call(
        self,
        args: Sequence[object] | None,
        kwargs: Mapping[str, object] | None,
        options: dict[str, object],
    ) -> Call:
        return Call(self.app, self, self.name, args, kwargs, options, self._dedupe_publish)

    def _dedupe_publish(
        self,
        args: Sequence[object] | None,
        kwargs: Mapping[str, object] | None,
        options: dict[str, Any],
    ) -> AnyAsyncResult:
        return super().apply_async(
            tuple(args) if args is not None else None,
            dict(kwargs) if kwargs is not None else None,
            **options,
        )

    def before_start(
        self, task_id: str, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        """The execution guard: skip or defer this run if another run of its key is live."""
        refuse_uninstalled(self, task_id)
        guard(self, task_id)

    def __call__(self, *args: object, **kwargs: object) -> Any:
        """Run the task; in a worker, free its key as the body ends, before Celery stores
        the result: a caller whose ``.get()`` returned may call again at once."""
        request = self.request
        if request.called_directly or getattr(request, _IN_BODY, False):
            # A direct call, or the task calling itself within its run: Celery's own call.
            return super().__call__(*args, **kwargs)
        # Celery's tracer calls a task's body on its own request when the task has no
        # __call__ (Task.__call__ would push a copy, and what the body sets on
        # self.request, a chain cut short, would be lost): so does this one.
        setattr(request, _IN_BODY, True)
        run = run_of(request)
        if run is not None and run.arguments is not None:
            args, kwargs = tuple(run.arguments[0]), run.arguments[1]  # (the latest call's)
        try:
            value = self.run(*args, **kwargs)
        except (Retry, Reject):
            raise  # (the key goes with the retry's message, or back to the queue)
        except Exception:
            end_of_body(self, request, RunEnd.of_body(returned=False))
            raise
        finally:
            setattr(request, _IN_BODY, False)
        end_of_body(self, request, RunEnd.of_body(returned=True))
        return value


def _never_unique(name: str) -> str:
    return (
        f"task {name!r}: a task with key_concurrency or key_rate_limit accepts every call "
        f"(each runs in turn); it is never deduplicated: call delay/apply_async, without "
        f"unique=True or *_unique (or dedupe.apply_async; for a batch, or from asyncio code: "
        f"dedupe.apply_many, dedupe.aapply_many, dedupe.aapply_async, which publish each call "
        f"in turn)"
    )


@signals.worker_init.connect
def _say_when_not_installed(sender: object = None, **_: object) -> None:
    # Connected for every worker that imports DedupeTask, installed or not: the one place
    # that can say at start what every run of these tasks will fail on.
    app = getattr(sender, "app", None)
    if app is None or installed(app) is not None:
        return
    names = sorted(name for name, task in app.tasks.items() if isinstance(task, DedupeTask))
    if names:
        logger.error(
            "celery-dedupe is not installed on Celery app %r, which has DedupeTask tasks "
            "(%s): each of their runs fails with NotInstalled (and frees its key) until "
            "dedupe.install(app) is called where the app is created",
            app.main,
            ", ".join(names),
        )
