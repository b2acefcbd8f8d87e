"""From a call to its dedup keys: bind the arguments, pick the ones that count, digest them,
name the keys.

Key format, versioned by :data:`KEY_VERSION` (a change of any rule here must bump it)::

    <prefix>:{<task name>:<32 hex digits>}        the record of a call
    <prefix>:{<task name>:<32 hex digits>}:run    the run lock (unique_until "started", "window")

:func:`format_call_key` spells it and :func:`parse_call_key` reads it back, its exact inverse.
The braces are a Redis Cluster hash tag: every key of one call lands in one slot, so one
Lua script may touch them all.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dedupe.errors import KeyDerivationError

from .canonical import Unencodable, canonical_bytes
from .generics import AnyTask
from .limits import LIMIT_KEY_NAMES
from .options import SEPARATE_RUN_LOCK, UniqueOptions

__all__ = [
    "FLOW_SUFFIXES",
    "KEY_VERSION",
    "LATEST_SUFFIX",
    "RAN_SUFFIX",
    "RUN_SUFFIX",
    "Binder",
    "CallKeyParts",
    "CallKeys",
    "KeyInputs",
    "alive_key",
    "binder_for",
    "call_digest",
    "call_keys",
    "format_call_key",
    "keys_for",
    "parse_call_key",
    "tag_safe",
    "task_name_of_tag",
    "tick_key",
    "view_keys",
    "view_task_keys",
    "watch_keys",
]

#: Personalises BLAKE2b, so that digests of a future key format never equal today's.
KEY_VERSION = b"dedupe-key-v1"


#: Ends the name of a call's separate run lock (``unique_until="started"``).
RUN_SUFFIX = ":run"
#: The suffix of a call key's latest-arguments hash (:attr:`CallKeys.latest`).
LATEST_SUFFIX = ":latest"
#: The suffix of a call key's ended runs (:attr:`CallKeys.ran`).
RAN_SUFFIX = ":ran"
#: The suffixes of flow control's keys beside a record: a debounced or replacing call's
#: latest arguments and ended runs, a limited key's keys (:func:`dedupe.values.limits.limit_keys`).
FLOW_SUFFIXES = (LATEST_SUFFIX, RAN_SUFFIX, *(f":{name}" for name in LIMIT_KEY_NAMES))
#: The length of a call's digest (:func:`call_digest`), in hex digits.
_DIGEST_LENGTH = 32


@dataclass(frozen=True, slots=True)
class CallKeys:
    """The Redis keys of one call.

    ``call`` holds the call's record while it is queued (and, with ``unique_until="finished"``,
    while it runs); ``run`` is the key a run holds: the same key, or with
    ``unique_until="started"`` a separate run lock.

    >>> CallKeys.of("dedupe:{t:ab}", separate_run_lock=True)
    CallKeys(call='dedupe:{t:ab}', run='dedupe:{t:ab}:run')
    """

    call: str
    run: str

    @classmethod
    def of(cls, call: str, *, separate_run_lock: bool) -> CallKeys:
        """The keys of a call, from its call key."""
        return cls(call, call + RUN_SUFFIX if separate_run_lock else call)

    @property
    def latest(self) -> str:
        """The hash of the latest arguments left by the duplicates of a debounced or
        replacing call, one field per task id (same hash tag as the call key)."""
        return self.call + LATEST_SUFFIX

    @property
    def ran(self) -> str:
        """The runs of a debounced or replacing call that ended, each a task id and its
        retry count (no arguments), kept while the broker may deliver their messages again
        (same hash tag as the call key)."""
        return self.call + RAN_SUFFIX

    @property
    def names(self) -> list[str]:
        """The distinct key names: the call key first."""
        return [self.call] if self.run == self.call else [self.call, self.run]


def call_keys(prefix: str, task_name: str, digest: str, *, separate_run_lock: bool) -> CallKeys:
    """Name the keys of a call from its digest."""
    return CallKeys.of(
        format_call_key(prefix, task_name, digest), separate_run_lock=separate_run_lock
    )


def format_call_key(prefix: str, task_name: str, digest: str) -> str:
    """The key of a call's record; :func:`parse_call_key` reads it back.

    >>> format_call_key("dedupe", "reports:eu", "ab")
    'dedupe:{reports:eu:ab}'
    """
    return f"{prefix}:{{{tag_safe(task_name)}:{digest}}}"


class CallKeyParts(NamedTuple):
    """What a call key or run lock of a prefix is made of."""

    task_name: str
    digest: str
    #: The key is a call's separate run lock (:data:`RUN_SUFFIX`), not its record.
    run_lock: bool


def parse_call_key(prefix: str, key: str) -> CallKeyParts | None:
    """The parts of a call key or run lock of ``prefix`` (:func:`format_call_key`), or None
    for any other key: another prefix's or program's, or one of flow control's.

    >>> parse_call_key("dedupe", "dedupe:{reports:eu:0123456789abcdef0123456789abcdef}:run")
    CallKeyParts(task_name='reports:eu', digest='0123456789abcdef0123456789abcdef', run_lock=True)
    """
    head = f"{prefix}:{{"
    if not key.startswith(head):
        return None
    body = key[len(head) :]
    run_lock = body.endswith(RUN_SUFFIX)
    if run_lock:
        body = body[: -len(RUN_SUFFIX)]
    if not body.endswith("}"):
        return None
    name, colon, digest = body[:-1].rpartition(":")
    if not colon or len(digest) != _DIGEST_LENGTH:
        return None
    return CallKeyParts(task_name_of_tag(name), digest, run_lock)


def alive_key(prefix: str) -> str:
    """The marker key whose absence tells a worker that the dedup Redis lost its data.

    >>> alive_key("dedupe")
    'dedupe:alive'
    """
    return f"{prefix}:alive"


def watch_keys(prefix: str, watcher: str) -> tuple[str, str]:
    """The keys of one worker's watch on the dedup Redis (:mod:`dedupe.recovery.held`): a list
    nobody writes, which it blocks on (a restart ends the wait at once), and its own marker, whose
    absence tells it the data was lost where the server does not say which run it is.

    >>> watch_keys("dedupe", "vm:41")
    ('dedupe:watch', 'dedupe:alive:vm:41')
    """
    return f"{prefix}:watch", f"{prefix}:alive:{watcher}"


def tick_key(prefix: str, entry_name: str, tick: int) -> str:
    """The key of one tick of a beat entry: the beat that creates it sends that tick.

    >>> tick_key("dedupe", "nightly-report", 20431)
    'dedupe:beat:{nightly-report}:20431'
    """
    return f"{prefix}:beat:{{{tag_safe(entry_name)}}}:{tick}"


def view_keys(prefix: str) -> tuple[str, str]:
    """The web view's switch (present while a ``celery dedupe web`` server runs: producers and
    workers then log their events) and its set of task names with events. Outside
    ``prefix:``, so that listing the records (SCAN ``prefix:*``) never meets them.

    >>> view_keys("dedupe")
    ('dedupe/view:on', 'dedupe/view:tasks')
    """
    return f"{prefix}/view:on", f"{prefix}/view:tasks"


def view_task_keys(prefix: str, task_name: str, minute: int) -> tuple[str, str]:
    """One task's event stream for the web view and its counts of one minute (one hash
    tag: one round trip writes both, also on a Redis Cluster).

    >>> view_task_keys("dedupe", "reports", 29000000)
    ('dedupe/view:{reports}:events', 'dedupe/view:{reports}:minute:29000000')
    """
    head = f"{prefix}/view:{{{tag_safe(task_name)}}}"
    return f"{head}:events", f"{head}:minute:{minute}"


def tag_safe(task_name: str) -> str:
    """A task name as keys spell it: ``}`` (which would end the Redis Cluster hash tag early,
    or leave it empty, and part a call's keys across slots) and ``%`` percent-escaped.

    >>> tag_safe("reports}eu")
    'reports%7Deu'
    """
    if "}" not in task_name and "%" not in task_name:
        return task_name
    return task_name.replace("%", "%25").replace("}", "%7D")


def task_name_of_tag(text: str) -> str:
    """The task name :func:`tag_safe` spelled as ``text``."""
    if "%" not in text:
        return text
    return _ESCAPE.sub(lambda match: "%" if match.group(1) == "25" else "}", text)


_ESCAPE = re.compile(r"%(25|7D)")


class KeyInputs(NamedTuple):
    """The options that name a call's keys, beside its prefix, task name and arguments: the
    one description both a derivation (:meth:`derive`) and a remembered call's entry
    (:func:`keys_for`) are made of, so that an input added here changes both.

    A tuple: hashed in C, as part of every remembered call's lookup.
    """

    on: tuple[str, ...] | None
    key: Callable[..., object] | None
    separate_run_lock: bool

    @classmethod
    def of(cls, options: UniqueOptions) -> KeyInputs:
        """The inputs of a call's keys in ``options``."""
        return cls(options.on, options.key, options.until in SEPARATE_RUN_LOCK)

    def derive(
        self,
        prefix: str,
        task_name: str,
        binder: Binder | None,
        args: Sequence[object] | None,
        kwargs: Mapping[str, object] | None,
    ) -> CallKeys:
        """The keys of a call, derived from scratch."""
        digest = call_digest(
            task_name, binder, args, kwargs, unique_on=self.on, unique_key=self.key
        )
        return call_keys(prefix, task_name, digest, separate_run_lock=self.separate_run_lock)


def keys_for(
    prefix: str,
    task: AnyTask | None,
    task_name: str,
    options: UniqueOptions,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
) -> CallKeys:
    """The keys of a call of ``task`` (None: a task not registered in this process).

    A duplicate repeats its arguments, so a task's binder remembers the keys of its recent
    calls whose keys cannot change from one call to the next (:meth:`Binder.memo_key`): the
    next such call looks them up instead of deriving them again.
    """
    if task is None:
        return KeyInputs.of(options).derive(prefix, task_name, None, args, kwargs)
    binder = binder_for(task)
    # A task's calls share one options object, unless a call overrides them: its inputs are
    # made once (this runs on every call).
    last = binder.last_inputs
    if last[0] is options:
        inputs = last[1]
    else:
        inputs = KeyInputs.of(options)
        binder.last_inputs = (options, inputs)
    if not kwargs and inputs.key is None:
        arguments = binder.memo_key(args)
        if arguments is not None:
            memo = (prefix, task_name, inputs, arguments)
            known = binder.remembered.get(memo)
            if known is None:
                known = inputs.derive(prefix, task_name, binder, args, kwargs)
                binder.remember(memo, known)
            return known
    return inputs.derive(prefix, task_name, binder, args, kwargs)


#: Calls whose keys a task's binder remembers, at most: a few hundred bytes each, per task,
#: for the duplicates of recent calls (an app of a hundred tasks holds a few MB at most).
_REMEMBERED = 128
#: The longest str argument whose call is remembered (a memo must not hold large values).
_MEMO_TEXT = 256
#: Ints a remembered call may carry (a memo must not hold large values).
_MEMO_INT = 2**63
#: Default values that no call can change (a mutable default may be changed in place
#: between calls, and its key with it).
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


class Binder:
    """Binds call arguments to a task's signature, with defaults applied.

    Gives the mapping ``inspect.Signature.bind`` + ``apply_defaults`` gives, several times
    faster (it runs on every call); a call that does not fit is handed to inspect, for its
    exact error message.
    """

    def __init__(self, task_name: str, signature: inspect.Signature) -> None:
        self.task_name = task_name
        self.signature = signature
        kinds = inspect.Parameter
        params = list(signature.parameters.values())
        #: Names that may be passed by position, in order.
        self._positional = [
            p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        #: Names that may be passed by keyword.
        self._keywords = {
            p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        }
        self._var_positional = next(
            (p.name for p in params if p.kind is kinds.VAR_POSITIONAL), None
        )
        self._var_keyword = next((p.name for p in params if p.kind is kinds.VAR_KEYWORD), None)
        self._defaults = [(p.name, p.default) for p in params if p.default is not kinds.empty]
        self._required = [
            p.name
            for p in params
            if p.default is kinds.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        ]
        empty = inspect.Parameter.empty
        plain = signature.replace(
            parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
            return_annotation=empty,
        )
        #: How error messages show the signature: ``proj.sync(customer_id, full=False)``.
        self.display = f"{task_name}{plain}"
        #: The keys of recent calls, by prefix, task name, :class:`KeyInputs` and
        #: :meth:`memo_key`.
        self.remembered: dict[tuple[object, ...], CallKeys] = {}
        #: The options of the last call and their :class:`KeyInputs` (to start, the defaults').
        start = UniqueOptions()
        self.last_inputs = (start, KeyInputs.of(start))
        #: Calls of this signature may be remembered: every default is immutable.
        self._memoable = all(_immutable(default) for _, default in self._defaults)

    def memo_key(self, args: Sequence[Any] | None) -> tuple[object, ...] | None:
        """What a call without keyword arguments has its keys remembered under (its
        arguments), or None when they may not be remembered: only ints and strs are, of
        exactly those types (``True`` and ``1`` compare equal and have different keys, as do
        ``0.0`` and ``-0.0``), and none large.
        """
        # (``Any``: an exact type check does not narrow, and a cast costs a call per argument.)
        if not self._memoable:
            return None
        if not args:
            return ()
        for value in args:
            kind = type(value)
            if kind is int:
                if not -_MEMO_INT <= value < _MEMO_INT:
                    return None
            elif kind is not str or len(value) > _MEMO_TEXT:
                return None
        return tuple(args)

    def remember(self, memo: tuple[object, ...], keys: CallKeys) -> None:
        """Keep the keys of a call under ``memo``, within the bound."""
        if len(self.remembered) >= _REMEMBERED:
            self.remembered.clear()  # (a bound, not an LRU: a duplicate refills its entry at once)
        self.remembered[memo] = keys

    def bind(self, args: Sequence[object], kwargs: Mapping[str, object]) -> dict[str, object]:
        bound = self._fast_bind(args, kwargs)
        if bound is not None:
            return bound
        try:
            slow = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise KeyDerivationError(
                self.task_name, None, f"{exc} (signature: {self.display})"
            ) from None
        slow.apply_defaults()
        return dict(slow.arguments)

    def _fast_bind(
        self, args: Sequence[object], kwargs: Mapping[str, object]
    ) -> dict[str, object] | None:
        """The bound arguments, or None when the call does not fit (inspect then explains)."""
        positional = self._positional
        if len(args) > len(positional) and self._var_positional is None:
            return None
        bound = dict(zip(positional, args, strict=False))
        if self._var_positional is not None:
            bound[self._var_positional] = tuple(args[len(positional) :])
        extra = {}
        for name, value in kwargs.items():
            if name in bound:
                return None  # given twice (or a *args name passed by keyword)
            if name in self._keywords:
                bound[name] = value
            elif self._var_keyword is not None:
                extra[name] = value
            else:
                return None  # unexpected keyword, or a positional-only name by keyword
        if self._var_keyword is not None:
            bound[self._var_keyword] = extra
        for name, default in self._defaults:
            bound.setdefault(name, default)
        for name in self._required:
            if name not in bound:
                return None  # missing (inspect says which)
        return bound


def _immutable(value: object) -> bool:
    if type(value) in _IMMUTABLE:
        return True
    return type(value) is tuple and all(_immutable(item) for item in value)


# Kept on the task object, as Celery keeps its own per-task caches: a signature is worth
# computing once (inspect.signature costs far more than a bind), and one attribute read is
# the cheapest way back to it on every call.
_BINDER = "_dedupe_binder"


def binder_for(task: AnyTask) -> Binder:
    """The cached :class:`Binder` of a Celery task object."""
    binder = getattr(task, _BINDER, None)
    if isinstance(binder, Binder):
        return binder
    binder = Binder(task.name, inspect.signature(task.run))
    setattr(task, _BINDER, binder)
    return binder


def call_digest(
    task_name: str,
    binder: Binder | None,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
    *,
    unique_on: Sequence[str] | None = None,
    unique_key: Callable[..., object] | None = None,
) -> str:
    """The 128-bit hex digest of the arguments that make a call unique.

    ``binder`` is None for a task that is not registered in this process (the send_task
    path): its arguments count exactly as passed, positional and keyword apart.

    >>> call_digest("t", None, (1,), {}) == call_digest("t", None, [1], None)
    True
    """
    args = args or ()
    kwargs = kwargs or {}
    if unique_key is not None:
        try:
            value: object = unique_key(*args, **kwargs)
        except Exception as exc:
            raise KeyDerivationError(
                task_name, None, f"unique_key {_name_of(unique_key)} raised {exc!r}"
            ) from exc
        return _digest(task_name, "unique_key() result", value)
    if binder is not None:
        arguments = binder.bind(args, kwargs)
    elif unique_on:
        arguments = dict(kwargs)
    else:
        arguments = {"args": list(args), "kwargs": kwargs}
    if unique_on:
        arguments = _pick(task_name, binder, arguments, unique_on)
    try:
        packed = canonical_bytes(arguments)
    except Unencodable as exc:
        raise _unencodable(task_name, exc) from None
    return _hexdigest(packed)


def _digest(task_name: str, label: str, value: object) -> str:
    try:
        packed = canonical_bytes(value)
    except Unencodable as exc:
        raise KeyDerivationError(task_name, label + exc.path, _unencodable_reason(exc)) from None
    return _hexdigest(packed)


# Copying a keyed hasher is cheaper than setting one up with its parameters on every call.
_HASHER = hashlib.blake2b(digest_size=16, person=KEY_VERSION)


def _hexdigest(packed: bytes) -> str:
    hasher = _HASHER.copy()
    hasher.update(packed)
    return hasher.hexdigest()


def _pick(
    task_name: str, binder: Binder | None, arguments: dict[str, object], names: Sequence[str]
) -> dict[str, object]:
    picked = {}
    for name in names:
        if name in arguments:
            picked[name] = arguments[name]
        elif binder is not None:
            raise KeyDerivationError(
                task_name,
                name,
                f"unique_on names it, but it is not a parameter of {binder.display}",
            )
        else:
            raise KeyDerivationError(
                task_name,
                name,
                "unique_on names it, but the task is not registered in this process, so "
                "only keyword arguments can be matched to names: pass it as a keyword "
                "argument or import the task's module",
            )
    return picked


def _unencodable(task_name: str, exc: Unencodable) -> KeyDerivationError:
    # exc.path starts with the argument name, as in "['payload'][3]".
    path = exc.path
    argument: str | None = path or None
    if path.startswith("['"):
        end = path.index("']")
        argument = path[2:end] + path[end + 2 :]
    return KeyDerivationError(task_name, argument, _unencodable_reason(exc))


def _unencodable_reason(exc: Unencodable) -> str:
    problem = exc.problem or (
        f"a {type(exc.value).__module__}.{type(exc.value).__qualname__} value has no "
        f"canonical encoding (supported: None, bool, int, float, str, bytes, list, tuple, "
        f"dict, set, datetime, date, time, UUID, Decimal, pydantic models)"
    )
    return (
        f"{problem}. Pass a value that encodes, leave the argument out with "
        f"unique_on=(...), or compute the key yourself with unique_key=callable"
    )


def _name_of(func: Callable[..., object]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)
