"""Celery's private members that dedupe uses (see :mod:`dedupe.compat`).

Each member, and what is turned off without it: docs/design-notes.md, "dedupe.compat".
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from types import CodeType
from typing import Any, TypeVar

import celery
from billiard import common as billiard_common
from celery import Celery, _state
from celery.app.amqp import AMQP
from celery.app.task import Task
from celery.backends.asynchronous import AsyncBackendMixin
from celery.beat import Scheduler
from celery.result import AsyncResult
from celery.utils.collections import ConfigurationView
from celery.utils.functional import maybe_list
from celery.worker import request as worker_request
from celery.worker import state as worker_state
from celery.worker.control import Panel
from celery.worker.pidbox import Pidbox

from .members import Members

__all__ = [
    "BEAT_SYNC",
    "MEMBERS",
    "RESULTS",
    "REVOKES",
    "SENDER",
    "SENDER_KEYWORDS",
    "SETTINGS",
    "after_decode_errors",
    "after_revokes",
    "app_of_task",
    "copied",
    "count_beat_send",
    "current_app",
    "current_worker_task",
    "decode_errors_followed",
    "exec_options",
    "on_fulfilled",
    "pending_results",
    "pool_process_terminating",
    "removes_pending_by_task_id",
    "result_without_init",
    "setting_keys",
]

MEMBERS = Members("Celery")
logger = logging.getLogger("dedupe.compat")
# (Celery's stubs know none of its private members.)
_Mixin: Any = AsyncBackendMixin
_View: Any = ConfigurationView
_Scheduler: Any = Scheduler
_T = TypeVar("_T")


def _names_in(function: Any) -> tuple[str, ...]:
    return tuple(function.__code__.co_names)


_current_app: Callable[[], Celery] | None = getattr(_state, "get_current_app", None)
MEMBERS.need("celery._state.get_current_app", "the current app's lookup", lambda: _current_app)


def current_app() -> Celery:
    """The app Celery would use for a call given none."""
    if _current_app is not None:
        return _current_app()
    # (The object behind Celery's proxy: apps are compared and keyed by identity.)
    return unproxied(celery.current_app)


def _terminate_flag() -> Callable[[], bool] | None:
    # billiard 4.3 asks its own; before, the handler set this list's one item.
    fired = getattr(billiard_common, "terminate_handler_fired", None)
    if callable(fired):
        return lambda: bool(fired())
    flag = getattr(billiard_common, "_should_have_exited", None)
    if isinstance(flag, list) and len(flag) == 1 and isinstance(flag[0], bool):
        return lambda: bool(flag[0])
    return None


_terminating = _terminate_flag()
MEMBERS.need(
    "billiard.common's terminate flag (terminate_handler_fired, or _should_have_exited)",
    "keeping the key of a run whose pool process is terminated (Celery's cancel)",
    lambda: _terminating,
)


def pool_process_terminating() -> bool:
    """Has this pool process's own terminate-signal handler fired? (billiard's: the worker
    sent it SIGTERM, a cancel or a revoke's terminate, and it unwinds to its exit.)"""
    return _terminating is not None and _terminating()


def current_worker_task() -> Task[..., object] | None:
    """The task a worker runs in this thread now (not one called directly inside it): the
    app's public ``current_worker_task``, the same for every app."""
    task: Task[..., object] | None = celery.current_app.current_worker_task
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


def _pydantic_dump_known() -> bool:
    """Where Celery's apply_async dumps pydantic arguments (5.7+), is the dump where dedupe
    looks? (5.5 and 5.6 take pydantic tasks but dump nothing at the call.)"""
    names = inspect.unwrap(Task.apply_async).__code__.co_names
    dumps = any("pydantic" in name for name in names)
    return not dumps or "_dump_pydantic_arguments" in names


def _task_from_fun_sets(name: str) -> bool:
    """Does ``Celery._task_from_fun`` name ``name`` (a member it sets on each task)?"""
    task_from_fun: Any = getattr(celery.Celery, "_task_from_fun", None)
    if task_from_fun is None:
        return False
    constants = task_from_fun.__code__.co_consts
    # (A dict display's keys are one tuple among the constants.)
    return any(name == c or (isinstance(c, tuple) and name in c) for c in constants)


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
        MEMBERS.need(
            "celery.app.task.Task._dump_pydantic_arguments", _SENDER, _pydantic_dump_known
        ),
        MEMBERS.need(
            "celery.app.task.Task.__v2_compat__", _SENDER, lambda: "__v2_compat__" in vars(Task)
        ),
        MEMBERS.need(
            "celery.app.task.Task.__header__ (set by Celery._task_from_fun)",
            _SENDER,
            lambda: _task_from_fun_sets("__header__"),
        ),
    ]
)


def argument_check(task: Task[..., object]) -> Callable[..., object] | None:
    """The check of a call's arguments against the task's signature (``typing``), or None."""
    check: Callable[..., object] | None = getattr(task, "__header__", None) if task.typing else None
    return check


def sent_through_celery_only(task: Task[..., object]) -> bool:
    """Must calls of ``task`` go through Celery's own apply_async: a task of Celery's old
    base, or one whose pydantic arguments Celery dumps?"""
    return bool(task.__v2_compat__) or getattr(task, "_dump_pydantic_arguments", None) is not None


def unproxied(obj: _T) -> _T:
    """The object behind Celery's lazy proxy (what ``@shared_task`` returns), else ``obj``."""
    unwrap = getattr(obj, "_get_current_object", None)
    behind: _T = unwrap() if callable(unwrap) else obj
    return behind


def exec_options(task: Any) -> Mapping[str, Any]:
    """The task's own execution options (queue, routing, priority...), as apply_async merges."""
    options: Mapping[str, Any] = task._get_exec_options()
    return options


def app_of_task(task: Any) -> Celery:
    """The app ``apply_async`` publishes with: the task's, whatever the call was given."""
    app: Celery = task._get_app()
    return app


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


def result_without_init(result: object) -> None:
    """What ``AsyncResult.__init__`` sets but for the promise (made when first used)."""
    vars(result).update(_cache=None, _ignored=False)


def on_fulfilled(result: Any) -> Callable[..., object]:
    """The result's own callback for its ``on_ready`` promise."""
    callback: Callable[..., object] = result._on_fulfilled
    return callback


def pending_results(backend: object) -> Iterable[MutableMapping[str, Any]]:
    """The backend's maps of the results waited on, by task id (none: not an async one)."""
    pending: Iterable[MutableMapping[str, Any]] = getattr(backend, "_pending_results", None) or ()
    return pending


SETTINGS: bool = MEMBERS.need(
    "celery.utils.collections.ConfigurationView._key and ._to_keys",
    "reading a setting in one step",
    lambda: callable(_View._key) and callable(_View._to_keys),
)


def setting_keys(conf: Any, name: str) -> tuple[str, ...]:
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


def _names_within(code: CodeType) -> set[str]:
    """The names a function's code reads, its nested functions' included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _names_within(constant)
    return names


def _decode_errors_followed() -> bool:
    # (Imported here, at a worker's start: see Members.need_later.)
    from celery.worker.consumer.consumer import Consumer
    from celery.worker.consumer.tasks import Tasks

    consumer: Any = Consumer
    tasks: Any = Tasks
    return (
        list(inspect.signature(consumer.on_decode_error).parameters) == ["self", "message", "exc"]
        and "on_decode_error" in _names_within(tasks.start.__code__)
        and "on_decode_error" in _names_within(consumer.create_task_handler.__code__)
    )


decode_errors_followed = MEMBERS.need_later(
    "celery.worker.consumer.Consumer.on_decode_error (looked up at each decode error)",
    "freeing the key of a message whose body cannot be decoded",
    _decode_errors_followed,
)


def after_decode_errors(consumer: Any, callback: Callable[[Any, BaseException], None]) -> bool:
    """Call ``callback(message, exc)`` once ``consumer`` has handled a message whose body it
    cannot decode (Celery logs and acks it, and sends no signal); False where this Celery
    cannot be followed there. Call it before the consumer starts."""
    if not decode_errors_followed():
        return False
    handle = consumer.on_decode_error

    def on_decode_error(message: Any, exc: BaseException) -> None:
        handle(message, exc)
        try:
            callback(message, exc)
        except Exception:  # (the consumer's loop must go on whatever the callback does)
            logger.exception("celery-dedupe: after a decode error")

    consumer.on_decode_error = on_decode_error
    return True


_Panel: Any = Panel
_requests: Any = worker_request  # (the stubs know no create_request_cls)
_Request: Any = worker_request.Request
_REVOKES = "freeing the key of a message revoked while it waits in the worker"
REVOKES: bool = all(
    [
        MEMBERS.need(
            "celery.worker.control.Panel.data['revoke'] (the worker's mailbox looks it up at "
            "each command)",
            _REVOKES,
            lambda: (
                list(inspect.signature(_Panel.data["revoke"]).parameters)[:2]
                == ["state", "task_id"]
                and {"Panel", "data"} <= set(_names_in(Pidbox.__init__))
            ),
        ),
        MEMBERS.need(
            "celery.worker.state.reserved_requests, .active_requests and .revoked",
            _REVOKES,
            lambda: all(
                callable(getattr(worker_state, name).__contains__)
                for name in ("reserved_requests", "active_requests", "revoked")
            ),
        ),
        MEMBERS.need(
            "celery.worker.request.Request._apply_result (set as the request goes to the pool)",
            _REVOKES,
            lambda: (
                "_apply_result" in vars(_Request)
                and "_apply_result" in _names_in(_Request.execute_using_pool)
                and "_apply_result" in _names_within(_requests.create_request_cls.__code__)
            ),
        ),
    ]
)

_after_revoke: list[Callable[[Any, list[Any]], None]] = []
_revoke_lock = threading.Lock()


def after_revokes(callback: Callable[[Any, list[Any]], None]) -> bool:
    """Call ``callback(consumer, requests)`` once a worker of this process has handled a
    ``revoke`` command, with the revoked requests that wait in it, not yet given to its pool
    (Celery drops each when it reaches it, and says so only then); False where this Celery
    cannot be followed there."""
    if not REVOKES:
        return False
    with _revoke_lock:
        if not _after_revoke:  # (the command's handler is one for the process)
            _Panel.data["revoke"] = _followed(_Panel.data["revoke"])
        if callback not in _after_revoke:
            _after_revoke.append(callback)
    return True


def _followed(handle: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handle)
    def revoke(state: Any, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        reply = handle(state, task_id, *args, **kwargs)
        try:
            waiting = _waiting_revoked(set(maybe_list(task_id) or ()))
            if waiting:
                for callback in _after_revoke:
                    callback(state.consumer, waiting)
        except Exception:  # (the worker's mailbox must go on whatever the callback does)
            logger.exception("celery-dedupe: after a revoke")
        return reply

    return revoke


def _waiting_revoked(task_ids: set[str]) -> list[Any]:
    """The requests of ``task_ids`` that the worker holds, revoked, and will drop unrun: not
    running, and not given to the pool yet (there, a revoke without terminate stops nothing).
    Those that wait for their eta too, where Celery keeps them apart (``scheduled_requests``;
    an older Celery's are found as their eta comes, and freed then)."""
    running = worker_state.active_requests
    scheduled = getattr(worker_state, "scheduled_requests", ())
    return [
        request
        for request in [*_snapshot(worker_state.reserved_requests), *_snapshot(scheduled)]
        if request.id in task_ids
        and request.id in worker_state.revoked
        and request not in running
        and request._apply_result is None
    ]


def _snapshot(requests: Iterable[Any]) -> list[Any]:
    # (A set another thread adds to meanwhile, an eta come due under a threaded timer: one
    # that keeps changing is left, and its revoked requests are freed as the worker meets them.)
    try:
        return copied(requests, tries=3)
    except RuntimeError:
        return []


def copied(items: Iterable[Any], *, tries: int = 10) -> list[Any]:
    """A list of what the worker's requests (Celery's ``worker_state`` sets, a bucket's
    contents) hold, read from another thread than the one that changes them: copied again
    when a change cuts the copy short, up to ``tries`` times; then RuntimeError."""
    for _ in range(tries):
        try:
            return list(items)
        except RuntimeError:  # (changed during the copy by the consumer's thread)
            continue
    raise RuntimeError("the worker's requests kept changing while they were read")
