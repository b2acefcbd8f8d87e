"""From a call to its keys: bind the arguments to the task's signature, pick the ones that
count, digest them (:func:`call_digest`), and name the keys (:func:`keys_for`; the names
are :mod:`dedupe.values.keys`'). A task's :class:`Binder` remembers the keys of its recent
calls, made of the same :class:`KeyInputs` as a derivation.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from dedupe.errors import KeyDerivationError
from dedupe.surfaces import AnyTask

from .canonical import Unencodable, canonical_bytes
from .keys import KEY_VERSION, CallKeys, call_keys
from .options import SEPARATE_RUN_LOCK, UniqueOptions

__all__ = ["Binder", "KeyInputs", "binder_for", "call_digest", "keys_for"]


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
