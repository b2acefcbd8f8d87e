"""The private members of Celery, kombu and redis-py live in dedupe.compat, are checked when
it is imported, and one that is gone turns its shortcut off with a warning naming it: calls
still deduplicate, on the plain path. Each library's test breaks a member in a process of its
own (a broken library cannot be mended in place)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dedupe.compat import known_members, missing_members
from dedupe.store.plain_runner import PlainScriptRunner
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_provisional

from .conftest import RedisFactory
from .helpers import run_script

PACKAGE = Path(__file__).resolve().parent.parent / "dedupe"


def test_every_private_member_is_there_in_the_installed_versions() -> None:
    assert missing_members() == []


def _private_names() -> set[str]:
    """The private attribute names of the members the compat modules list."""
    return {
        part
        for member in known_members()
        for word in member.path.replace("(", " ").replace(")", " ").split()
        for part in [word.removesuffix(",").removesuffix("'s").rpartition(".")[2]]
        if part.startswith("_")
    }


def _uses(path: Path, names: set[str]) -> list[str]:
    """Where ``path`` reads one of ``names`` off an object not its own (not self or cls), or
    names one in a string (getattr, a shadow)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in names:
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in names:
            found.append(f"{path.name}:{node.lineno} {node.value!r}")
    return found


def test_no_module_outside_compat_touches_a_private_member_of_the_libraries() -> None:
    names = _private_names()
    assert {
        "_put",
        "_q_for_pri",
        "_get_exec_options",
        "_sock",
        "__header__",
        "__v2_compat__",
    } <= names
    outside = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if "compat" not in path.relative_to(PACKAGE).parts
        for use in _uses(path, names)
    ]
    assert outside == []


_BROKEN = """
import json, logging, sys
import redis
from celery import Celery

url = sys.argv[1]
records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger("dedupe").addHandler(handler)

import dedupe
from dedupe import events

app = Celery("broken", broker=url, set_as_current=True)
app.conf.update(task_default_queue="broken", dedupe_redis_url=url, dedupe_key_prefix="broken")
dedupe.install(app)

@app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="broken.job")
def job(x): ...

paths = []
events.call_accepted.connect(lambda sender=None, path=None, **_: paths.append(path), weak=False)
results = [CALL for _ in range(3)]
holder = dedupe.lookup(job, (1,))
print(json.dumps({
    "warnings": [line for line in records if "is not there" in line],
    "deduplicated": [result.deduplicated for result in results],
    "one id": len({result.id for result in results}) == 1,
    "queued": redis.Redis.from_url(url).llen("broken"),
    "confirmed": holder is not None and not holder.provisional,
    "paths": paths,
}))
"""


def _broken(url: str, breaking: str, call: str = "job.delay(1)") -> dict[str, Any]:
    found: dict[str, Any] = run_script(
        textwrap.dedent(breaking) + _BROKEN.replace("CALL", call), url, timeout=60
    )
    return found


def _deduplicated_on_the_plain_path(found: dict[str, Any]) -> None:
    assert found["deduplicated"] == [False, True, True]
    assert found["one id"] is True
    assert found["queued"] == 1
    assert found["confirmed"] is True


def test_a_kombu_member_gone_turns_the_one_step_publish_off_and_says_so(
    redis_factory: RedisFactory,
) -> None:
    found = _broken(
        redis_factory().url,
        """
        from kombu.transport import redis as kombu_redis
        del kombu_redis.Channel._put_fanout  # (gone in a later kombu, say)
        """,
    )
    assert len(found["warnings"]) == 1
    assert "kombu.transport.redis.Channel._put_fanout" in found["warnings"][0]
    assert "the one-step publish is off" in found["warnings"][0]
    _deduplicated_on_the_plain_path(found)
    assert found["paths"] != ["one-step"]


def test_a_celery_member_gone_is_named_and_calls_find_the_current_app_the_public_way(
    redis_factory: RedisFactory,
) -> None:
    found = _broken(
        redis_factory().url,
        """
        import celery._state
        # Celery's own modules bind it at import, as they would bind a new name: imported
        # first, they keep working without it.
        import celery.app.base, celery.app.task, celery.result, celery.worker.request
        del celery._state.get_current_app  # (renamed in a later Celery, say)
        """,
        call='dedupe.apply_async("broken.job", (1,))',
    )
    assert [line.split("'s ")[1].split(" is ")[0] for line in found["warnings"]] == [
        "celery._state.get_current_app"
    ]
    _deduplicated_on_the_plain_path(found)


def test_a_redis_py_member_gone_is_named_and_error_replies_are_still_told_apart(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory()
    found = _broken(
        server.url,
        """
        import sys
        import redis._parsers
        del redis._parsers.BaseParser  # (no longer exported by a later redis-py, say)
        import redis as _redis
        _redis.Redis.from_url(sys.argv[1]).script_flush()
        """,
    )
    assert len(found["warnings"]) == 1
    assert "redis._parsers.BaseParser.parse_error" in found["warnings"][0]
    # (Every script's first EVALSHA met NOSCRIPT, and was loaded: the error told apart.)
    _deduplicated_on_the_plain_path(found)


@pytest.fixture
def plain_store(redis_factory: RedisFactory) -> Store:
    client = redis.Redis.from_url(redis_factory().url)
    store = Store(client)
    store._run = PlainScriptRunner(client)
    return store


def test_the_plain_runner_decides_calls_as_the_stores_own_client_does(plain_store: Store) -> None:
    keys = CallKeys.of("plain:job:1", separate_run_lock=False)
    assert plain_store.enqueue(keys, pack_provisional("a", 1), 60_000) is None
    holder = plain_store.enqueue(keys, pack_provisional("b", 2), 60_000)
    assert holder is not None
    assert holder.task_id == "a"
    others = [CallKeys.of(f"plain:job:{n}", separate_run_lock=False) for n in (2, 3, 2)]
    answers = plain_store.enqueue_many(
        [(k, pack_provisional(f"t{n}", 3), 60_000) for n, k in enumerate(others)]
    )
    assert [answer.task_id if answer else None for answer in answers] == [None, None, "t0"]


def test_the_plain_runner_answers_a_deferred_read(plain_store: Store) -> None:
    keys = CallKeys.of("plain:job:deferred", separate_run_lock=False)
    record = pack_provisional("a", 1)
    slot = plain_store.start_enqueue(keys, record, 60_000)
    assert plain_store.enqueue_result(keys, slot, record, 60_000) is None
    assert plain_store.cancel(keys, "a", exactly=record) is True


def test_the_plain_runner_leaves_the_clients_retry_policy_as_it_was(
    redis_factory: RedisFactory,
) -> None:
    retry = Retry(NoBackoff(), 3)
    client = redis.Redis.from_url(redis_factory().url, retry=retry)
    store = Store(client)
    store._run = PlainScriptRunner(client)
    keys = CallKeys.of("plain:job:once", separate_run_lock=False)
    store.enqueue(keys, pack_provisional("a", 1), 60_000)
    assert client.get_retry() is retry
    assert client.connection_pool.connection_kwargs.get("retry") is retry
