"""Every public error comes back whole from pickle and from a result backend: its class, its
message and its fields (a backend rebuilds an error as its class called with its args)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import redis
from celery import Celery

import dedupe
from dedupe import errors

from .conftest import in_process_worker

EXAMPLES: dict[str, list[errors.DedupeError]] = {
    "DedupeError": [errors.DedupeError("something went wrong")],
    "ConfigurationError": [errors.ConfigurationError("dedupe_unique_ttl must be positive")],
    "NotInstalled": [errors.NotInstalled("proj")],
    "KeyDerivationError": [
        errors.KeyDerivationError("jobs.report", "options.when", "a datetime has no key"),
        errors.KeyDerivationError("jobs.report", None, "missing a required argument: 'x'"),
    ],
    "ArgumentsTooLarge": [errors.ArgumentsTooLarge("jobs.report", 70_000, 65_536)],
    "AlreadyQueued": [
        errors.AlreadyQueued("jobs.report", "4f1c", "queued", "dedupe:{jobs.report:ab12}")
    ],
    "RedisUnavailable": [
        errors.RedisUnavailable("enqueue", redis.ConnectionError("Connection refused"))
    ],
    "RedisCommandError": [
        errors.RedisCommandError("enqueue", "dedupe:{x:1}", redis.ResponseError("WRONGTYPE")),
        errors.RedisCommandError("script load", None, redis.ResponseError("NOPERM")),
    ],
    "RecordFormatError": [errors.RecordFormatError("dedupe:{jobs.report:ab12}")],
    "UnexpectedReply": [errors.UnexpectedReply("enqueue", [b"held", 3, None])],
}

CASES = [
    pytest.param(error, id=f"{name}-{n}")
    for name, examples in EXAMPLES.items()
    for n, error in enumerate(examples)
]


def fields(error: BaseException) -> dict[str, Any]:
    """An error's own fields, an exception among them by its class and text."""
    return {
        name: (type(value), str(value)) if isinstance(value, BaseException) else value
        for name, value in vars(error).items()
    }


def test_every_public_error_has_an_example() -> None:
    assert set(EXAMPLES) == set(errors.__all__)


@pytest.mark.parametrize("error", CASES)
def test_an_error_comes_back_from_pickle_whole(error: errors.DedupeError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.args == error.args
    assert fields(back) == fields(error)


@pytest.mark.parametrize("error", CASES)
def test_an_error_comes_back_from_a_json_result_backend_with_its_message(
    redis_app: Celery, error: errors.DedupeError
) -> None:
    # Celery's own round trip of a failure's exception, as a result's reader gets it.
    backend = redis_app.backend
    stored = backend.encode(backend.prepare_exception(error, "json"))
    back = backend.exception_to_python(backend.decode(stored))
    assert type(back) is type(error)
    assert str(back) == str(error)


def test_an_error_a_task_raised_reads_the_same_from_the_redis_result_backend(
    redis_app: Celery,
) -> None:
    raised = errors.RedisUnavailable("enqueue", redis.ConnectionError("Connection refused"))

    @redis_app.task(shared=False, name="jobs.fails")
    def fails() -> None:
        raise raised

    assert redis_app.conf.result_serializer == "json"
    result = fails.delay()
    with in_process_worker(redis_app), pytest.raises(dedupe.RedisUnavailable) as read:
        result.get(timeout=15)
    assert str(read.value) == (
        "dedup Redis unavailable during enqueue: ConnectionError: Connection refused"
    )
    assert read.value.operation == "enqueue"
    assert str(read.value.cause) == "ConnectionError: Connection refused"
