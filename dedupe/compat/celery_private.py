"""Celery's private members that dedupe uses (see :mod:`dedupe.compat`).

=================================================  =============================================
member                                             without it
=================================================  =============================================
``_state.get_current_app``                         the current app from ``celery.current_app``
``_state.get_current_worker_task``                 the run from ``celery.current_task`` (the
                                                   innermost task, unless called directly)
``Task._get_exec_options``, ``Task._get_app``,     the single-call sender is off (calls go
``AMQP.create_task_message``'s keywords            through Celery's ``apply_async``)
``AsyncResult._on_fulfilled``, ``._cache``,        a duplicate's result is made and dropped the
``._ignored``; ``AsyncBackendMixin.                way Celery makes and drops any result
_pending_results``, ``._remove_pending_result``
``ConfigurationView._key``, ``._to_keys``          a setting is read through ``conf[name]``
``Scheduler._tasks_since_sync``, ``._do_sync``     the dedup beat syncs its schedule when
                                                   Celery's tick does, not every few sends
=================================================  =============================================
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import celery
from celery import _state
from celery.app.amqp import AMQP
from celery.app.task import Task
from celery.backends.asynchronous import AsyncBackendMixin
from celery.beat import Scheduler
from celery.result import AsyncResult
from celery.utils.collections import ConfigurationView

from .members import Members

__all__ = [
    "BEAT_SYNC",
    "MEMBERS",
    "RESULTS",
    "SENDER",
    "SENDER_KEYWORDS",
    "SETTINGS",
    "app_of_task",
    "count_beat_send",
    "current_app",
    "current_worker_task",
    "exec_options",
    "on_fulfilled",
    "pending_results",
    "removes_pending_by_task_id",
    "result_without_init",
    "setting_keys",
]

MEMBERS = Members("Celery")
# (Celery's stubs know none of its private members.)
_Mixin: Any = AsyncBackendMixin
_View: Any = ConfigurationView
_Scheduler: Any = Scheduler


def _names_in(function: Any) -> tuple[str, ...]:
    return tuple(function.__code__.co_names)


_current_app: Any = getattr(_state, "get_current_app", None)
MEMBERS.need("celery._state.get_current_app", "the current app's lookup", lambda: _current_app)
_worker_task: Any = getattr(_state, "get_current_worker_task", None)
MEMBERS.need(
    "celery._state.get_current_worker_task", "the current run's lookup", lambda: _worker_task
)


def current_app() -> Any:
    """The app Celery would use for a call given none."""
    if _current_app is not None:
        return _current_app()
    return celery.current_app


def current_worker_task() -> Any:
    """The task a worker runs in this thread now (not one called directly inside it)."""
    if _worker_task is not None:
        return _worker_task()
    task: Any = celery.current_task
    if task is None or task.request.called_directly:
        return None
    return task


#: The keywords the single-call sender gives ``create_task_message`` (Celery's ``as_task_v2``).
SENDER_KEYWORDS = (
    "task_id",
    "name",
    "args",
    "kwargs",
    "countdown",
    "eta",
    "group_id",
    "group_index",
    "expires",
    "retries",
    "chord",
    "callbacks",
    "errbacks",
    "reply_to",
    "time_limit",
    "soft_time_limit",
    "create_sent_event",
    "root_id",
    "parent_id",
    "shadow",
    "chain",
    "ignore_result",
    "replaced_task_nesting",
    "origin",
    "argsrepr",
    "kwargsrepr",
)


def _takes_sender_keywords() -> bool:
    parameters = inspect.signature(AMQP.as_task_v2).parameters
    return all(name in parameters for name in SENDER_KEYWORDS)


_SENDER = "the single-call sender"
SENDER: bool = all(
    [
        MEMBERS.need(
            "celery.app.task.Task._get_exec_options",
            _SENDER,
            lambda: callable(getattr(Task, "_get_exec_options", None)),
        ),
        MEMBERS.need(
            "celery.app.task.Task._get_app",
            _SENDER,
            lambda: callable(getattr(Task, "_get_app", None)),
        ),
        MEMBERS.need(
            "celery.app.amqp.AMQP.create_task_message (as_task_v2's keywords)",
            _SENDER,
            _takes_sender_keywords,
        ),
    ]
)


def exec_options(task: Any) -> Mapping[str, Any]:
    """The task's own execution options (queue, routing, priority...), as apply_async merges."""
    options: Mapping[str, Any] = task._get_exec_options()
    return options


def app_of_task(task: Any) -> Any:
    """The app ``apply_async`` publishes with: the task's, whatever the call was given."""
    return task._get_app()


_RESULTS = "the light results of duplicates"
RESULTS: bool = all(
    [
        MEMBERS.need(
            "celery.result.AsyncResult._on_fulfilled",
            _RESULTS,
            lambda: callable(getattr(AsyncResult, "_on_fulfilled", None)),
        ),
        MEMBERS.need(
            "celery.result.AsyncResult._cache and ._ignored",
            _RESULTS,
            lambda: {"_cache", "_ignored"} <= set(_names_in(AsyncResult.__init__)),
        ),
        MEMBERS.need(
            "celery.backends.asynchronous.AsyncBackendMixin._pending_results",
            _RESULTS,
            lambda: "_pending_results" in _names_in(_Mixin._remove_pending_result),
        ),
    ]
)


def removes_pending_by_task_id() -> bool:
    """Before Celery 5.7, ``_remove_pending_result`` takes a task id (one waiter per id); from
    5.7 on, the result (it counts the waiters)."""
    remove = getattr(_Mixin, "_remove_pending_result", lambda result: None)
    return "task_id" in inspect.signature(remove).parameters


def result_without_init(result: Any) -> None:
    """What ``AsyncResult.__init__`` sets but for the promise (made when first used)."""
    vars(result).update(_cache=None, _ignored=False)


def on_fulfilled(result: Any) -> Any:
    """The result's own callback for its ``on_ready`` promise."""
    return result._on_fulfilled


def pending_results(backend: Any) -> Iterable[MutableMapping[str, Any]]:
    """The backend's maps of the results waited on, by task id (none: not an async one)."""
    pending: Iterable[MutableMapping[str, Any]] = getattr(backend, "_pending_results", None) or ()
    return pending


SETTINGS: bool = MEMBERS.need(
    "celery.utils.collections.ConfigurationView._key and ._to_keys",
    "reading a setting in one step",
    lambda: callable(_View._key) and callable(_View._to_keys),
)


def setting_keys(conf: Any, name: str) -> tuple[Any, ...]:
    """The keys ``ConfigurationView.__getitem__`` tries for ``name``, in its order (Celery
    has no public way to ask for them); () when they cannot be had."""
    if not SETTINGS:
        return ()
    try:
        return tuple(conf._key(key) for key in conf._to_keys(name))
    except (AttributeError, TypeError):
        return ()


BEAT_SYNC: bool = MEMBERS.need(
    "celery.beat.Scheduler._tasks_since_sync and ._do_sync",
    "the dedup beat's sync every few sends",
    lambda: "_tasks_since_sync" in vars(Scheduler) and callable(_Scheduler._do_sync),
)


def count_beat_send(scheduler: Any) -> None:
    """Scheduler.apply_async's own bookkeeping: sync the schedule every few sends."""
    if BEAT_SYNC:
        scheduler._tasks_since_sync += 1
        if scheduler.should_sync():
            scheduler._do_sync()
