"""Celery's ``Task.apply_async``, for the accepted calls of a batch: per call what differs
between calls, once per batch what cannot.

A batch publishes many calls of one task with the same options through one producer. Per
call, Celery's ``apply_async`` and ``send_task`` spend much of their time on what is the same
for every call of a batch: the task's and the app's settings, read through the app's layered
configuration, and the producer's context (kombu's part is the batch seam's:
:mod:`dedupe.brokers.redis_publish`). :class:`CallSender` reads the task's and the app's part once,
and per call does what ``send_task`` does with it (step by step in the design notes:
docs/design-notes.md, "dedupe.producer.call_sender").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import celery
from celery import Celery
from celery.app.routes import Router
from celery.app.task import Task as CeleryTask
from celery.result import AsyncResult
from celery.utils.nodenames import anon_nodename

from dedupe.brokers.redis_publish import is_redis_channel
from dedupe.compat import celery_private, kombu_private
from dedupe.compat.celery_private import exec_options

from .call import Call, Publish, TaskPublish
from .message_repr import plain_repr
from .plain_calls import refuse_plain_dedup_options

__all__ = ["CallSender", "sender_for"]

#: Options that ``apply_async`` or ``send_task`` take as parameters of their own and treat
#: in ways a sender does not: a call with one of them goes through Celery's apply_async.
#: (A sender treats ``task_id``, ``producer``, ``countdown``, ``eta``, ``expires``,
#: ``time_limit``, ``soft_time_limit``, ``ignore_result`` and ``add_to_parent``; every other
#: option goes on to the router, the message and kombu as with Celery.)
_CELERY_TREATS = frozenset(
    {
        "link",
        "link_error",
        "shadow",
        "connection",
        "router",
        "result_cls",
        "publisher",
        "group_id",
        "group_index",
        "retries",
        "chord",
        "chain",
        "reply_to",
        "root_id",
        "parent_id",
        "route_name",
        "task_type",
        "replaced_task_nesting",
        "stamped_headers",
        "origin",  # (a sender names the batch's origin itself)
    }
)


#: Options that Celery's ``apply_async`` treats as not given when they are None.
_NONE_IS_ABSENT = frozenset({"link", "link_error", "shadow"})


class CallSender:
    """Publishes calls of one task as its ``apply_async`` would (a :data:`Publish`)."""

    def __init__(
        self,
        task: Any,
        app: Celery,
        fallback: Publish,
        *,
        as_tuple: bool,
        alike: bool,
        single: bool = False,
        sends_delays: bool = True,
    ) -> None:
        self._task = task
        self._app = app
        self._name: str = task.name
        self._fallback = fallback
        #: DedupeTask's publish hands apply_async a tuple and a dict, whatever it was given.
        self._as_tuple = as_tuple
        self._preopts: Mapping[str, Any] = exec_options(task)
        self._check = celery_private.argument_check(task)
        amqp = app.amqp
        router: Any = amqp.router
        self._router = router
        # Calls with the same options (``alike``) have the same route where the app routes by
        # the options alone (a task_routes entry may look at the arguments): routed once.
        self._route_once = alike and _routes_by_options(router)
        #: The first call's route (its options as the router gave them back).
        self._routed: dict[str, Any] | None = None
        # (Cached properties of kombu's, read through a descriptor at each access.)
        self._create_task_message: Any = amqp.create_task_message
        self._send_task_message: Any = amqp.send_task_message
        # What as_task_v2 gives saferepr (before Celery 5.5 no maxlevels: saferepr's 3).
        self._argsrepr_maxsize: int = amqp.argsrepr_maxsize
        self._kwargsrepr_maxsize: int = amqp.kwargsrepr_maxsize
        self._repr_maxlevels: int | None = app.conf.get("task_repr_maxlevels", 3)
        self._backend = app.backend
        self._reply_to = app.thread_oid
        # What as_task_v2 would name each message's origin: this process, on this host.
        self._origin = anon_nodename()
        #: What a call takes from the run it is made in and from the app's settings: once
        #: for a batch; for each call by a single call's sender (cached, see :func:`sender_for`).
        self._context: _Context | None = None if single else _Context.now(app)
        #: Countdowns and etas are sent here (False: left to Celery, whose send_task routes
        #: them to quorum queues' delayed delivery on RabbitMQ).
        self._sends_delays = sends_delays

    @classmethod
    def of(cls, call: Call, producer: Any, *, alike: bool = False) -> CallSender | None:
        """A sender for the calls of ``call``'s task with its publish through ``producer``
        (of a Redis broker), or None where only Celery's own apply_async will do.
        ``alike``: the calls have the same options, but for their task id and headers."""
        if not is_redis_channel(producer.channel):
            return None  # (send_task's quorum-queue countdown is for RabbitMQ brokers)
        return cls._of(call, alike=alike, single=False, sends_delays=True)

    @classmethod
    def _of(cls, call: Call, *, alike: bool, single: bool, sends_delays: bool) -> CallSender | None:
        # (Members of Celery's and ours that celery-types does not declare are read below.)
        task: Any = call.task
        publish = call.publish
        if task is None:
            return None
        if not (celery_private.SENDER and kombu_private.SENDER):
            return None  # (a member it needs is not there: warned at install)
        app = celery_private.app_of_task(task)
        if not _sends_through_celery(app) or app.conf.task_always_eager:
            return None
        if isinstance(publish, TaskPublish) and publish.task is task:
            reaches = _apply_async_of(type(task), task)
            as_tuple = False
        elif _is_dedupe_publish(task, publish):
            reaches = _apply_async_after(type(task), type(task)._dedupe_publish)
            as_tuple = True
        else:
            return None
        if reaches is not CeleryTask.apply_async or not _is_celerys(reaches):
            return None
        if (
            celery_private.sent_through_celery_only(task)
            # Celery 5.5+ refuses such a task in apply_async, earlier ones do not.
            or (task.soft_time_limit and task.time_limit)
        ):
            return None
        return cls(
            task,
            app,
            publish,
            as_tuple=as_tuple,
            alike=alike,
            single=single,
            sends_delays=sends_delays,
        )

    def takes(self, options: Mapping[str, Any]) -> bool:
        """Does the sender send a call with these options? (Else Celery's apply_async does.)"""
        if not _CELERY_TREATS.isdisjoint(options) and not _absent_only(options):
            return False
        if not self._sends_delays and (options.get("countdown") or options.get("eta")):
            return False
        # A time to expire at is read against the clock at each send; a negative delay warns.
        expires = options["expires"] if "expires" in options else self._preopts.get("expires")
        return expires is None or (isinstance(expires, (int, float)) and expires >= 0)

    def __call__(
        self,
        args: Sequence[object] | None,
        kwargs: Mapping[str, object] | None,
        call_options: dict[str, Any],
    ) -> AsyncResult[Any]:
        if (
            not self.takes(call_options)
            or not call_options.get("task_id")
            or call_options.get("producer") is None
        ):
            return self._fallback(args, kwargs, call_options)
        own = dict(call_options)
        task_id = own.pop("task_id")
        producer = own.pop("producer")
        for name in _NONE_IS_ABSENT:
            if name in own and own[name] is None:
                del own[name]
        if self._as_tuple:
            args = tuple(args) if args is not None else None
            kwargs = dict(kwargs) if kwargs is not None else None
        task = self._task
        # -- Task.apply_async
        if self._check is not None:
            self._check(*(args or ()), **(kwargs or {}))
        shadow = task.shadow_name(args, kwargs, own)
        options = dict(self._preopts, **own)
        options.setdefault("ignore_result", task.ignore_result)
        # -- Celery.send_task
        countdown = options.pop("countdown", None)
        eta = options.pop("eta", None)
        time_limit = options.pop("time_limit", None)
        soft_time_limit = options.pop("soft_time_limit", None)
        expires = options.pop("expires", None)
        add_to_parent = options.pop("add_to_parent", True)
        ignore_result = options.pop("ignore_result")
        name = self._name
        options = self._route(options, args, kwargs)
        if expires is not None:
            options["expiration"] = expires
        context = self._context or _Context.now(self._app)
        parent = context.parent
        if context.inherit_priority and parent is not None:
            options.setdefault("priority", parent.request.delivery_info.get("priority"))
        message = self._create_task_message(
            task_id=task_id, name=name, args=args, kwargs=kwargs, countdown=countdown,
            eta=eta, group_id=None, group_index=None, expires=expires, retries=0,
            chord=None, callbacks=None, errbacks=None, reply_to=self._reply_to,
            time_limit=time_limit, soft_time_limit=soft_time_limit,
            create_sent_event=context.sent_event, root_id=context.root_id,
            parent_id=context.parent_id, shadow=shadow, chain=None,
            ignore_result=ignore_result, replaced_task_nesting=0, origin=self._origin,
            **self._reprs(args, kwargs, options), **options,
        )  # fmt: skip
        with kombu_private.library_errors(producer.connection):
            if not ignore_result:
                self._backend.on_task_call(producer, task_id)
            self._send_task_message(producer, name, message, **options)
        result: AsyncResult[Any] = task.AsyncResult(task_id)
        result.ignored = ignore_result
        if add_to_parent and parent is not None:
            parent.add_trail(result)
        return result

    def _reprs(self, args: Any, kwargs: Any, options: dict[str, Any]) -> dict[str, Any]:
        """The message's argsrepr and kwargsrepr where they are cheap to make as saferepr
        would (a None is made by Celery); none given where the call gives its own."""
        reprs = {}
        levels = self._repr_maxlevels
        if "argsrepr" not in options:
            reprs["argsrepr"] = plain_repr(
                args or (), maxsize=self._argsrepr_maxsize, maxlevels=levels
            )
        if "kwargsrepr" not in options:
            reprs["kwargsrepr"] = plain_repr(
                kwargs or {}, maxsize=self._kwargsrepr_maxsize, maxlevels=levels
            )
        return reprs

    def _route(self, options: dict[str, Any], args: Any, kwargs: Any) -> dict[str, Any]:
        """The app's route of a call with ``options``."""
        routed, headers = self._routed, options.get("headers")
        if routed is not None and isinstance(headers, dict):
            # What the router gives back: the first call's route with this call's headers in
            # their place (it copies every option but the None ones).
            return {**routed, "headers": headers}
        route: dict[str, Any] = self._router.route(options, self._name, args, kwargs, self._task)
        if self._route_once and isinstance(headers, dict):
            self._routed = dict(route)
        return route


class _Context:
    """What ``send_task`` reads for each call from the run it is made in (the parent's ids
    and priority) and from the app's settings."""

    __slots__ = ("inherit_priority", "parent", "parent_id", "root_id", "sent_event")

    def __init__(self, parent: Any, sent_event: bool, inherit_priority: bool) -> None:
        self.parent = parent or None
        self.sent_event = sent_event
        self.root_id = self.parent_id = None
        self.inherit_priority = False
        if parent:
            self.root_id = parent.request.root_id or parent.request.id
            self.parent_id = parent.request.id
            self.inherit_priority = inherit_priority

    @classmethod
    def now(cls, app: Celery) -> _Context:
        parent = app.current_worker_task
        conf = app.conf
        inherit = bool(conf.task_inherit_parent_priority) if parent else False
        return cls(parent, conf.task_send_sent_event, inherit)


def _absent_only(options: Mapping[str, Any]) -> bool:
    """Are the options a sender leaves to Celery all given as None (absent, to Celery)?
    (DedupeTask's apply_async hands them over so.)"""
    treated = _CELERY_TREATS.intersection(options)
    return treated <= _NONE_IS_ABSENT and all(options[name] is None for name in treated)


def _sends_through_celery(app: Celery) -> bool:
    return (
        "send_task" not in vars(app)
        and type(app).send_task is Celery.send_task
        and _is_celerys(Celery.send_task)
    )


def _apply_async_of(cls: type, task: Any) -> Any:
    return None if "apply_async" in vars(task) else getattr(cls, "apply_async", None)


_CELERY_DIR = os.path.join(os.path.dirname(celery.__file__), "")


def _is_celerys(function: Any) -> bool:
    """Is ``function`` Celery's own, not wrapped in place (a tracer or an APM agent patches
    ``Task.apply_async`` and ``Celery.send_task`` on Celery's classes: Sentry, Datadog, New
    Relic)? A sender would go around the wrapper, and what it adds (trace headers, spans)
    would be missing from the message: such calls go through Celery."""
    code = getattr(function, "__code__", None)
    return (
        getattr(function, "__wrapped__", None) is None
        and code is not None
        and code.co_filename.startswith(_CELERY_DIR)
    )


def _is_dedupe_publish(task: Any, publish: Publish) -> bool:
    """Is ``publish`` DedupeTask's own (not an override), bound to ``task``?"""
    function = getattr(type(task), "_dedupe_publish", None)
    return (
        getattr(function, "__module__", None) == "dedupe.task"
        and getattr(function, "__qualname__", None) == "DedupeTask._dedupe_publish"
        and getattr(publish, "__self__", None) is task
        and getattr(publish, "__func__", None) is function
    )


def _apply_async_after(cls: type, function: Any) -> Any:
    """The apply_async that ``super()`` finds in ``function``, of a class of ``cls``'s MRO."""
    mro = cls.__mro__
    owner = next(i for i, klass in enumerate(mro) if function in vars(klass).values())
    for klass in mro[owner + 1 :]:
        if "apply_async" in vars(klass):
            return vars(klass)["apply_async"]
    return None


class _Senders(threading.local):
    """Each thread's single-call senders: a sender holds the thread's backend and reply-to
    id, and the process's origin (a forked child starts without any)."""

    def __init__(self) -> None:
        self.by_task: dict[tuple[int, type, bool], tuple[Any, CallSender | None, Any]] = {}


_senders = _Senders()


def _forget_senders() -> None:
    global _senders
    _senders = _Senders()


os.register_at_fork(after_in_child=_forget_senders)


def sender_for(call: Call, producer: Any) -> CallSender | None:
    """The sender of a single call through ``producer``, or None where only Celery's own
    apply_async will do (made once per task, transport kind and thread).

    What Celery's ``apply_async`` and ``send_task`` read from the task and the app on every
    call is read once here; what may change between calls (the run a call is made in, the
    settings a message takes) is read at each. On a transport other than Redis, a call with
    a countdown or an eta goes through Celery: ``send_task`` routes those on its own there.
    """
    task = call.task
    if task is None:
        return None
    redis_channel = is_redis_channel(producer.channel)
    key = (id(task), type(call.publish), redis_channel)
    by_task = _senders.by_task
    entry = by_task.get(key)
    # An agent that wraps apply_async or send_task after the first call (Sentry initialised
    # late) is seen at the next: the methods the decision was made on are kept with it
    # (Celery's own apply_async too: a DedupeTask's is ours, and reaches Celery's).
    app = task.app
    methods = (
        type(task).apply_async,
        CeleryTask.apply_async,
        vars(task).get("apply_async"),
        type(app).send_task,
        vars(app).get("send_task"),
    )
    if entry is None or entry[0] is not task or entry[2] != methods:
        sender = CallSender._of(call, alike=False, single=True, sends_delays=redis_channel)
        by_task[key] = entry = (task, sender, methods)
    return entry[1]


def _routes_by_options(router: Any) -> bool:
    """Does Celery's router route by the options alone (no task_routes entry of the app's:
    one may look at the arguments)? Ours first in the routes routes nothing."""
    routes = getattr(router, "routes", None)
    return (
        type(router) is Router
        and routes is not None
        and all(route is refuse_plain_dedup_options for route in routes)
    )
