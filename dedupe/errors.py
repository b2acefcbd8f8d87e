"""Every error celery-dedupe raises derives from ``DedupeError``."""

from __future__ import annotations

__all__ = [
    "AlreadyQueued",
    "ArgumentsTooLarge",
    "ConfigurationError",
    "DedupeError",
    "KeyDerivationError",
    "NotInstalled",
    "RecordFormatError",
    "RedisCommandError",
    "RedisUnavailable",
    "UnexpectedReply",
]


class DedupeError(Exception):
    """Root of every error celery-dedupe raises."""


class ConfigurationError(DedupeError, ValueError):
    """A setting or a task option has an invalid value, or a required one is missing."""


class NotInstalled(ConfigurationError):
    """A dedup feature was used on an app that ``dedupe.install(app)`` was never called for."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        # The args are the constructor's: a result backend (and pickle) rebuilds an error as
        # its class called with them, so a message there would be wrapped in itself. (So for
        # every error below; the message is made from them, in __str__.)
        super().__init__(app_name)

    def __str__(self) -> str:
        return (
            f"celery-dedupe is not installed on Celery app {self.app_name!r}: call "
            f"dedupe.install(app) once where the app is created (producers and workers alike)."
        )


class KeyDerivationError(DedupeError, TypeError):
    """The arguments of a call cannot be turned into a dedup key; nothing was written or sent."""

    def __init__(self, task_name: str, argument: str | None, reason: str) -> None:
        self.task_name = task_name
        #: The argument at fault (with its path inside nested values), or None when the
        #: arguments as a whole do not fit the task's signature.
        self.argument = argument
        self.reason = reason
        super().__init__(task_name, argument, reason)

    def __str__(self) -> str:
        where = f"argument {self.argument!r}" if self.argument is not None else "its arguments"
        return f"cannot derive a dedup key for task {self.task_name!r}: {where}: {self.reason}"


class ArgumentsTooLarge(DedupeError, ValueError):
    """A debounced or replacing call's arguments, serialised, exceed what may be kept in
    Redis (``dedupe.values.defaults.LATEST_ARGS_MAX``, 64 KiB); nothing was written or sent."""

    def __init__(self, task_name: str, size: int, limit: int) -> None:
        self.task_name = task_name
        self.size = size
        self.limit = limit
        super().__init__(task_name, size, limit)

    def __str__(self) -> str:
        return (
            f"task {self.task_name!r}: its arguments serialise to {self.size:,} bytes, more "
            f"than the {self.limit:,} a debounced or replacing call may keep in Redis; pass a "
            f"reference (an id, a path) instead of the data"
        )


class AlreadyQueued(DedupeError):
    """A call with ``on_duplicate="raise"`` found its key held by a queued or running task."""

    def __init__(self, task_name: str, task_id: str, state: str, key: str) -> None:
        self.task_name = task_name
        #: The id of the task that already holds the key (it will do the work).
        self.task_id = task_id
        #: ``"queued"`` or ``"running"``.
        self.state = state
        self.key = key
        super().__init__(task_name, task_id, state, key)

    def __str__(self) -> str:
        return f"task {self.task_name!r} is already {self.state} as {self.task_id} (key {self.key})"


class RedisUnavailable(DedupeError):
    """The dedup Redis could not be reached (raised with ``dedupe_on_redis_error="raise"``)."""

    def __init__(self, operation: str, cause: BaseException | str) -> None:
        self.operation = operation
        #: The error redis-py raised; in an error read back from a JSON result backend, where
        #: only its text travels, an ``Exception`` of that text.
        self.cause = _as_error(cause)
        super().__init__(operation, _error_text(cause))

    def __str__(self) -> str:
        return f"dedup Redis unavailable during {self.operation}: {self.args[1]}"


class RedisCommandError(DedupeError):
    """The dedup Redis refused a command for a reason that waiting does not fix (a script
    error, a wrong type under a dedup key, an ACL that forbids the command). Raised whatever
    ``dedupe_on_redis_error`` says: publishing past it would hide a broken deployment."""

    def __init__(self, operation: str, key: str | None, cause: BaseException | str) -> None:
        self.operation = operation
        self.key = key
        #: The error redis-py raised (see ``RedisUnavailable.cause``).
        self.cause = _as_error(cause)
        super().__init__(operation, key, _error_text(cause))

    def __str__(self) -> str:
        where = f" of {self.key}" if self.key else ""
        return f"the dedup Redis refused the {self.operation}{where}: {self.args[2]}"


class RecordFormatError(DedupeError, ValueError):
    """A key under the dedup prefix holds a value that is no celery-dedupe record."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(key)

    def __str__(self) -> str:
        return (
            f"{self.key} holds no celery-dedupe record (another program's value under the "
            f"dedup prefix, or a record of an incompatible version): delete the key, or give "
            f"celery-dedupe a prefix of its own (dedupe_key_prefix)"
        )


class UnexpectedReply(DedupeError):
    """A dedup script answered with a reply it never gives (a foreign script under its SHA,
    or scripts of another celery-dedupe version on the same server)."""

    def __init__(self, script: str, reply: object) -> None:
        self.script = script
        #: The reply as Redis gave it; in an error read back from a JSON result backend,
        #: its text.
        self.reply = reply
        super().__init__(script, _reply_text(reply))

    def __str__(self) -> str:
        return (
            f"the {self.script} script of celery-dedupe answered {self.args[1]}, which it never "
            f"does: is another version of celery-dedupe, or another program, using this Redis?"
        )


# A result backend's JSON carries an error's args only, each as itself when JSON can hold
# it: the args keep the text of what JSON cannot hold (an exception, bytes), and the
# constructor takes that text in its place, so the message reads the same after the trip.


def _error_text(cause: BaseException | str) -> str:
    return cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"


def _as_error(cause: BaseException | str) -> BaseException:
    return Exception(cause) if isinstance(cause, str) else cause


def _reply_text(reply: object) -> str:
    # (Replies are bytes, numbers, lists or None: a str is this text, read back.)
    return reply if isinstance(reply, str) else repr(reply)
