"""The private members of Celery, kombu and redis-py live in dedupe.compat, are checked when
it is imported, and one that is gone turns its shortcut off with a warning naming it: calls
still deduplicate, on the plain path. Each library's test breaks a member in a process of its
own (a broken library cannot be mended in place)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any

from dedupe.compat import known_members, missing_members

from .conftest import RedisFactory
from .helpers import run_script

PACKAGE = Path(__file__).resolve().parent.parent / "dedupe"


def test_every_private_member_is_there_in_the_installed_versions() -> None:
    assert missing_members(later_too=True) == []


def test_import_dedupe_leaves_celerys_worker_consumer_unimported() -> None:
    # The consumer binds build_tracer at its import: a tracing tool (Sentry) initialised
    # after `import dedupe` patches it, and the worker must bind the patched one.
    imported = run_script(
        """
        import json, sys
        import dedupe
        print(json.dumps("celery.worker.consumer.consumer" in sys.modules))
        """
    )
    assert imported is False


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
        "_parser",
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
app.conf.update(
    task_default_queue="broken", dedupe_redis_url=url, dedupe_key_prefix="broken", SETTINGS
)
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


def _broken(
    url: str, breaking: str, call: str = "job.delay(1)", settings: str = ""
) -> dict[str, Any]:
    script = _BROKEN.replace("CALL", call).replace("SETTINGS", settings)
    found: dict[str, Any] = run_script(textwrap.dedent(breaking) + script, url, timeout=60)
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


def test_a_redis_py_member_gone_is_named_and_duplicates_are_asked_of_redis(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory()
    found = _broken(
        server.url,
        """
        from redis._parsers import _RESP3Parser, _HiredisParser
        for parser in (_RESP3Parser, _HiredisParser):  # (renamed in a later redis-py, say)
            for kind in parser.__mro__:
                for name in ("set_invalidation_push_handler", "set_push_handler"):
                    if name in vars(kind):
                        delattr(kind, name)
        """,
        call="job.delay(1)",
        settings="dedupe_remember_duplicates=5.0",
    )
    assert len(found["warnings"]) == 1
    assert "redis.connection.AbstractConnection._parser's push handler" in found["warnings"][0]
    assert "remembered duplicates" in found["warnings"][0]
    _deduplicated_on_the_plain_path(found)
