"""What the store asks of a script runner: :class:`~dedupe.store.script_runner.ScriptRunner`
(one server, or a master that Sentinel names) and
:class:`~dedupe.store.cluster_runner.ClusterScriptRunner` (a Redis Cluster) both answer it,
so the store never asks which one it has.

A runner that cannot remember answers (a Cluster) tracks nothing: it answers "not worth
tracking" and "nothing remembered", and its tracked call is a plain one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from redis.commands.core import Script

from .connections import Reply
from .remembered import Answer
from .resp import Part

__all__ = ["RemembersNothing", "ScriptCalls"]

_T = TypeVar("_T")


class ScriptCalls(Protocol):
    """Runs the store's registered scripts: EVALSHA with a NOSCRIPT fallback, retries under
    the client's policy within the call budget."""

    #: Can one script touch keys of different calls (one server)? A Cluster's calls each go
    #: to their own slot's master: a script per call.
    spans_calls: bool

    def __call__(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, resend: bool = True
    ) -> object:
        """Run a script and return its reply. ``resend=False``: a script that must not run
        twice is not sent again once written (:class:`~dedupe.store.script_runner.Unanswered`)."""

    def call_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Part], Sequence[Part]]],
        *,
        resend: bool = True,
    ) -> list[object]:
        """Run ``script`` once per ``(keys, args)`` in one round trip (per master); the
        replies in order, an error reply as its exception in its place."""

    def send(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, reply: bool = False
    ) -> Reply | None:
        """Run a script without waiting for its reply; with ``reply``, keep it for
        :meth:`result` (same thread)."""

    def result(self, slot: Reply) -> object:
        """The reply of a :meth:`send` made with ``reply=True`` (waits for it)."""

    def flush(self, *, wait: bool = True) -> None:
        """Read the replies of this thread's sends now (sent again if the connection was
        lost): what was sent is applied once this returns. ``wait=False``: only replies that
        have arrived."""

    def poll_for(self, seconds: float) -> None:
        """Poll this long for a reply before sleeping for it, from now on (0: never)."""

    def command(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``: a command of the client itself, under the retries that suit it."""

    def call_tracked(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part]
    ) -> tuple[object, float | None]:
        """Run a script with Redis tracking the keys it reads for this thread: its reply, and
        when it was sent if the keys are tracked from then on, else None."""

    def worth_tracking(self, key: str) -> bool:
        """Was ``key`` met held in this thread a moment ago (worth tracking now)?"""

    def note_duplicate(self, key: str) -> None:
        """``key`` was met held, untracked."""

    def remember(self, key: str, until: float, value: Answer) -> None:
        """Keep ``value`` as this thread's answer for a key a tracked call just read."""

    def remembered(self, key: str) -> Answer | None:
        """This thread's remembered answer for ``key`` while Redis says nothing of it, or
        None."""

    def forget(self, key: str) -> None:
        """Drop this thread's remembered answer for ``key``."""


class _RunsScripts(Protocol):
    def __call__(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, resend: bool = True
    ) -> object: ...


class RemembersNothing:
    """The memory part of :class:`ScriptCalls` for a runner that tracks no key (a Cluster's,
    the pooled one of greenlets, the plain one): a tracked call is a plain call."""

    def call_tracked(
        self: _RunsScripts, script: Script, keys: Sequence[Part], args: Sequence[Part]
    ) -> tuple[object, float | None]:
        """A plain call: no key is tracked."""
        return self(script, keys, args), None

    def worth_tracking(self, key: str) -> bool:
        """Never: no key is tracked."""
        return False

    def note_duplicate(self, key: str) -> None:
        """Nothing to note: no key is tracked."""

    def remember(self, key: str, until: float, value: Answer) -> None:
        """Nothing is remembered."""

    def remembered(self, key: str) -> Answer | None:
        """Nothing: no answer is remembered."""
        return None

    def forget(self, key: str) -> None:
        """Nothing to forget."""
