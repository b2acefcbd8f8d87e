"""Tracing and APM tools see a deduplicated call as they see a plain one. Each tool runs in a
process of its own (it patches Celery's classes for good): Sentry's Celery integration wraps
``Task.apply_async`` and ``Celery.send_task``; OpenTelemetry's instrumentation listens to
Celery's publish signals."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from .conftest import RedisFactory
from .helpers import run_script

pytest.importorskip("sentry_sdk")
pytest.importorskip("opentelemetry.instrumentation.celery")

_APP = """
import json, random, sys
import redis
from celery import Celery
import dedupe

url = sys.argv[1]
app = Celery("traced", broker=url, set_as_current=False)
app.conf.update(task_default_queue="traced", dedupe_redis_url=url, dedupe_key_prefix="traced")
dedupe.install(app)

@app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="traced.job")
def job(x): ...

@app.task(shared=False, name="traced.plain")
def plain(x): ...

queue = redis.Redis.from_url(url)

def headers_of_the_message():
    raw = queue.rpop("traced")
    return json.loads(raw)["headers"] if raw else None
"""

_SENTRY = """
import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

class Recording(Transport):
    def capture_envelope(self, envelope): pass

sentry_sdk.init(
    dsn="http://key@localhost/1", transport=Recording, integrations=[CeleryIntegration()],
    traces_sample_rate=1.0,
)
calls = {
    "a plain task's delay": lambda: plain.delay(1),
    "DedupeTask.delay": lambda: job.delay(2),
    "delay_unique": lambda: job.delay_unique(3),
    "dedupe.apply_async": lambda: dedupe.apply_async(plain, (4,)),
    "dedupe.apply_many": lambda: dedupe.apply_many(job, [((5,), {})]),
}
found = {}
with sentry_sdk.start_transaction(name="request") as transaction:
    for name, call in calls.items():
        call()
        headers = headers_of_the_message() or {}
        trace = headers.get("sentry-trace", "")
        found[name] = {
            "sentry-trace": trace.split("-")[0] == transaction.trace_id,
            "baggage": transaction.trace_id in headers.get("baggage", ""),
        }
print(json.dumps(found))
"""

_SENTRY_LATE = """
job.delay(1)  # (before Sentry: its sender is made, and kept)
headers_of_the_message()
import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

class Recording(Transport):
    def capture_envelope(self, envelope): pass

sentry_sdk.init(
    dsn="http://key@localhost/1", transport=Recording, integrations=[CeleryIntegration()],
    traces_sample_rate=1.0,
)
with sentry_sdk.start_transaction(name="request") as transaction:
    job.delay(2)
    headers = headers_of_the_message() or {}
print(json.dumps(headers.get("sentry-trace", "").split("-")[0] == transaction.trace_id))
"""

_WRAPPED_LATE = """
import functools
from celery.app.task import Task

job.delay(1)  # (its sender is made, and kept)
headers_of_the_message()
celerys = Task.apply_async

@functools.wraps(celerys)
def traced(self, args=None, kwargs=None, **options):  # (as an agent wraps Celery's own)
    options["headers"] = {**(options.get("headers") or {}), "traced-by": "agent"}
    return celerys(self, args, kwargs, **options)

Task.apply_async = traced
job.delay(2)
print(json.dumps((headers_of_the_message() or {}).get("traced-by")))
"""

_SENTRY_WORKER = """
import time
import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

transactions = []

class Recording(Transport):
    def capture_envelope(self, envelope):
        for item in envelope.items:
            if item.type == "transaction":
                event = item.payload.json
                transactions.append((event["transaction"], event["contexts"]["trace"]["trace_id"]))

sentry_sdk.init(
    dsn="http://key@localhost/1", transport=Recording, integrations=[CeleryIntegration()],
    traces_sample_rate=1.0,
)
# (After init: Celery's worker consumer binds build_tracer, which Sentry patches, at import.)
from celery.contrib.testing.worker import start_worker

calls = {
    "a plain task's delay": ("traced.plain", lambda: plain.delay(1)),
    "DedupeTask.delay": ("traced.job", lambda: job.delay(2)),
    "delay_unique": ("traced.job", lambda: job.delay_unique(3)),
    "dedupe.apply_async": ("traced.job", lambda: dedupe.apply_async(job, (4,))),
    "dedupe.apply_many": ("traced.job", lambda: dedupe.apply_many(job, [((5,), {})])),
}
found = {}
with start_worker(app, pool="solo", perform_ping_check=False):
    for name, (task_name, call) in calls.items():
        with sentry_sdk.start_transaction(name=name) as transaction:
            call()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (task_name, transaction.trace_id) not in transactions:
            time.sleep(0.05)
        found[name] = (task_name, transaction.trace_id) in transactions
print(json.dumps(found))
"""

_OPENTELEMETRY = """
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.celery.utils import CTX_KEY
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
CeleryInstrumentor().instrument()
# (The instrumentation finds a task by its name in the current app's registry.)
app.set_current()
rng = random.Random(7)
for index in range(2000):
    job.delay(index if rng.random() >= 0.2 else -1)  # (20% of them duplicates of one call)
ids = {span.attributes.get("messaging.message.id") for span in exporter.get_finished_spans()}
queued = [json.loads(raw)["headers"]["id"] for raw in queue.lrange("traced", 0, -1)]
print(json.dumps({
    "queued": len(queued),
    "queued without a finished span": sum(task_id not in ids for task_id in queued),
    "spans left attached to the task": len(getattr(job, CTX_KEY, None) or {}),
}))
"""


def _run(script: str, url: str) -> Any:
    return run_script(textwrap.dedent(_APP) + textwrap.dedent(script), url)


def test_every_entry_points_message_carries_the_sentry_trace_of_the_caller(
    redis_factory: RedisFactory,
) -> None:
    found = _run(_SENTRY, redis_factory().url)
    assert found == {name: {"sentry-trace": True, "baggage": True} for name in found}
    assert len(found) == 5


def test_a_call_made_after_sentry_was_initialised_late_carries_its_trace(
    redis_factory: RedisFactory,
) -> None:
    assert _run(_SENTRY_LATE, redis_factory().url) is True


def test_a_wrapper_put_on_celerys_apply_async_after_the_first_call_sees_the_next(
    redis_factory: RedisFactory,
) -> None:
    assert _run(_WRAPPED_LATE, redis_factory().url) == "agent"


def test_the_worker_continues_the_sentry_trace_of_every_entry_points_call(
    redis_factory: RedisFactory,
) -> None:
    found = _run(_SENTRY_WORKER, redis_factory().url)
    assert found == dict.fromkeys(found, True)
    assert len(found) == 5


def test_opentelemetry_ends_a_span_for_every_published_call_and_keeps_none_attached(
    redis_factory: RedisFactory,
) -> None:
    found = _run(_OPENTELEMETRY, redis_factory().url)
    assert found["queued"] > 1500
    assert found["queued without a finished span"] == 0
    assert found["spans left attached to the task"] == 0
