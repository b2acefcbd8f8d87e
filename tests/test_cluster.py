"""The dedup store on a Redis Cluster: a real one (three masters with a replica each) started
for this module, calls, runs and beat ticks on every master, and the cluster changing under
them (a failover during calls and during a run, a slot migrated during calls, a master
frozen)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster
from celery import Celery
from celery.beat import ScheduleEntry
from celery.bin.base import CLIContext
from celery.schedules import schedule
from click.testing import CliRunner

import dedupe
import dedupe.store.cluster_runner
from dedupe.beat import DedupeScheduler
from dedupe.cli import dedupe as dedupe_cli
from dedupe.demo.server import find_redis_server
from dedupe.producer.guard import keys_of_call
from dedupe.runs.runtime import runtime_of
from dedupe.store.checks import eviction_risk
from dedupe.values.latest import unpack_arguments
from dedupe.values.urls import cluster_target

from .conftest import in_process_worker
from .helpers import require, wait_for
from .servers import ClusterSet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    require(find_redis_server() is not None, "no redis-server to start a Redis Cluster with")
    with ClusterSet() as started:
        yield started


@pytest.fixture
def cluster_app(make_app: Callable[..., Celery], cluster: ClusterSet) -> Celery:
    # The broker stays the suite's single Redis (kombu has no Cluster transport): the
    # records take the provisional path, as with any dedup Redis of its own.
    return make_app(dedupe_redis_url=cluster.url, dedupe_on_redis_error="raise")


@pytest.fixture
def job(cluster_app: Celery) -> Any:
    @cluster_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    return job


def _key(task: Any, x: int) -> str:
    """The record key of ``task(x)``."""
    return keys_of_call(task, (x,), None, None, {})[1].call


def _client(cluster: ClusterSet) -> redis.cluster.RedisCluster:
    return redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])


def _args_on_every_master(task: Any, cluster: ClusterSet, per_master: int = 3) -> list[int]:
    """Arguments whose keys land on each master, ``per_master`` each."""
    client = _client(cluster)
    found: dict[int, list[int]] = {}
    x = 0
    while len(found) < 3 or min(map(len, found.values())) < per_master:
        key = _key(task, x)
        owners = found.setdefault(cluster.master_of_slot(client.keyslot(key)), [])
        if len(owners) < per_master:
            owners.append(x)
        x += 1
    return [x for owners in found.values() for x in owners]


def _args_in_one_slot(task: Any, count: int, start: int = 0) -> tuple[int, list[int]]:
    """``count`` arguments whose keys share one hash slot (the slot of ``start``'s key)."""
    slot = redis.cluster.key_slot(_key(task, start).encode())
    found = [start]
    x = start + 1
    while len(found) < count:
        if redis.cluster.key_slot(_key(task, x).encode()) == slot:
            found.append(x)
        x += 1
    return slot, found


class Burst:
    """A thread calling ``task(x)`` for each of ``args``, over and over, until the block
    ends: the ids each call got, and any error (policy "raise": an error the cluster's
    change causes surfaces here)."""

    def __init__(self, task: Any, args: list[int]) -> None:
        self.task, self.args = task, args
        self.ids: dict[int, set[str]] = {x: set() for x in args}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._call)

    def _call(self) -> None:
        while not self._stop.is_set():
            for x in self.args:
                try:
                    self.ids[x].add(self.task.delay(x).id)
                except BaseException as exc:
                    self.errors.append(exc)

    def __enter__(self) -> Burst:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(30)


def test_a_cluster_url_names_its_nodes_and_their_login() -> None:
    target = cluster_target("rediss+cluster://user:p%40ss@h1:7000,h2/0")
    assert target is not None
    assert target.nodes == (("h1", 7000), ("h2", 6379))
    assert (target.username, target.password, target.ssl) == ("user", "p@ss", True)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("redis+cluster://h1:7000?ssl_cert_reqs=none", "dedupe_redis_options"),
        ("redis+cluster://h1:port", "host:port"),
        ("redis+cluster://", "at least one node"),
    ],
)
def test_a_cluster_url_that_cannot_be_read_says_why(url: str, error: str) -> None:
    with pytest.raises(dedupe.ConfigurationError, match=error):
        cluster_target(url)


def test_a_password_with_a_slash_is_read_whole() -> None:
    target = cluster_target("redis+cluster://:a/b@h1:7000")
    assert target is not None
    assert (target.password, target.nodes) == ("a/b", (("h1", 7000),))


def test_a_cluster_url_with_a_database_other_than_0_is_refused() -> None:
    with pytest.raises(dedupe.ConfigurationError, match="only database 0"):
        cluster_target("redis+cluster://h1:7000/3")


@pytest.mark.parametrize("policy", ["enqueue", "raise"])
def test_a_cluster_no_node_of_which_answers_follows_the_policy(
    policy: str, make_app: Callable[..., Celery], queue_length: Any
) -> None:
    app = make_app(dedupe_redis_url="redis+cluster://127.0.0.1:1", dedupe_on_redis_error=policy)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    if policy == "raise":
        with pytest.raises(dedupe.RedisUnavailable, match="cannot be connected"):
            job.delay(1)
        with pytest.raises(dedupe.RedisUnavailable):
            dedupe.apply_many(job, [((2,), {})])
        assert queue_length(app) == 0
    else:
        assert not job.delay(1).deduplicated  # published without its key, and said so
        assert not dedupe.apply_many(job, [((2,), {})])[0].deduplicated
        assert queue_length(app) == 2


def test_calls_deduplicate_on_every_master(job: Any, cluster: ClusterSet) -> None:
    args = _args_on_every_master(job, cluster)
    first = [job.delay(x) for x in args]
    again = [job.delay(x) for x in args]
    assert not any(result.deduplicated for result in first)
    assert all(result.deduplicated for result in again)
    assert [r.id for r in again] == [r.id for r in first]
    client = _client(cluster)
    assert all(client.exists(result.keys.call) for result in first)


def test_asyncio_calls_deduplicate_on_a_cluster(job: Any, cluster: ClusterSet) -> None:
    args = _args_on_every_master(job, cluster, per_master=1)

    async def twice() -> list[dedupe.DedupeResult]:
        results = [await job.aapply_async_unique((x,)) for x in args]
        return results + [await job.aapply_async_unique((x,)) for x in args]

    async def looked_up() -> list[dedupe.Holder | None]:
        return [await dedupe.alookup(job, (x,)) for x in args]

    results = asyncio.run(twice())
    assert [r.deduplicated for r in results] == [False] * 3 + [True] * 3
    assert [r.id for r in results[3:]] == [r.id for r in results[:3]]
    holders = asyncio.run(looked_up())
    assert [h.task_id if h else None for h in holders] == [r.id for r in results[:3]]


def test_a_batch_decides_calls_on_every_master(job: Any, cluster: ClusterSet) -> None:
    args = _args_on_every_master(job, cluster)
    held = job.delay(args[0])
    results = dedupe.apply_many(job, [((x,), {}) for x in [*args, *args]])
    assert [r.deduplicated for r in results] == [True] + [False] * (len(args) - 1) + [True] * len(
        args
    )
    assert results[0].id == held.id
    assert [r.id for r in results[len(args) :]] == [r.id for r in results[: len(args)]]


def test_a_replacing_batch_leaves_each_keys_last_arguments_on_every_master(
    cluster_app: Celery, cluster: ClusterSet
) -> None:
    @cluster_app.task(
        shared=False, base=dedupe.DedupeTask, unique=True, unique_on=("x",), on_duplicate="replace"
    )
    def replaced(x: int, value: int = 0) -> None: ...

    args = _args_on_every_master(replaced, cluster, per_master=1)
    first = [replaced.delay(x, 0) for x in args]
    batch = dedupe.apply_many(replaced, [((x, value), {}) for value in (1, 2) for x in args])
    assert [r.id for r in batch] == [r.id for r in first] * 2
    store = runtime_of(cluster_app).store
    left = [
        store.take_latest(keys_of_call(replaced, (x, 0), None, None, {})[1], result.id, 0)
        for x, result in zip(args, first, strict=True)
    ]
    assert [unpack_arguments(latest.body) if latest else None for latest in left] == [
        ([x, 2], {}) for x in args
    ]


def test_runs_claim_and_free_their_keys_on_every_master(
    cluster_app: Celery, cluster: ClusterSet
) -> None:
    started: list[int] = []

    @cluster_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def work(x: int) -> int:
        holder = dedupe.lookup(work, (x,))
        started.append(x if holder is not None and holder.state == "running" else -1)
        return x

    args = _args_on_every_master(work, cluster, per_master=2)
    with in_process_worker(cluster_app):
        results = [work.delay(x) for x in args]
        assert [r.get(timeout=20) for r in results] == args
    assert sorted(started) == sorted(args)  # each run saw its own key running
    wait_for(lambda: all(dedupe.lookup(work, (x,)) is None for x in args), message="freed")


def test_beats_side_by_side_send_each_tick_of_entries_on_every_master_once(
    cluster_app: Celery, tmp_path: Path, cluster: ClusterSet
) -> None:
    @cluster_app.task(shared=False, name="jobs.cluster_refresh")
    def refresh(x: int) -> None: ...

    beats = [
        DedupeScheduler(app=cluster_app, schedule_filename=str(tmp_path / f"schedule-{n}"))
        for n in range(2)
    ]
    every = schedule(3600.0, app=cluster_app)
    entries = [
        ScheduleEntry(
            name=f"entry-{n}",
            task="jobs.cluster_refresh",
            schedule=every,
            args=(n,),
            app=cluster_app,
        )
        for n in range(12)  # twelve tick keys: every master gets some
    ]
    sent = [[beat.apply_async(entry) for entry in entries] for beat in beats]
    assert all(result is not None for result in sent[0])
    assert all(result is None for result in sent[1])
    assert beats[1].dedupe_ticks_skipped == {entry.name: 1 for entry in entries}


def test_the_command_line_counts_and_clears_the_keys_of_every_master(
    job: Any, cluster_app: Celery, cluster: ClusterSet
) -> None:
    args = _args_on_every_master(job, cluster)
    for x in args:
        job.delay(x)

    def cli(*words: str) -> str:
        context = CLIContext(app=cluster_app, no_color=True, workdir=None, quiet=False)
        result = CliRunner().invoke(dedupe_cli, list(words), obj=context)
        assert result.exit_code == 0, result.output
        return str(result.output)

    totals = cli("stats").splitlines()[-1].split()
    assert totals == ["total", str(len(args)), "0", "0"]  # queued, running, provisional
    assert f"cleared {len(args)} keys" in cli("clear", "--all", "--yes")
    assert all(dedupe.lookup(job, (x,)) is None for x in args)


def test_the_web_view_lists_no_waiting_calls_on_a_cluster_and_says_why(
    cluster_app: Celery, cluster: ClusterSet
) -> None:
    pytest.importorskip("starlette", reason="the web extra: pip install 'celery-dedupe[web]'")
    from .view_server import served_view

    @cluster_app.task(shared=False, base=dedupe.DedupeTask, key_concurrency=1)
    def limited(x: int) -> None: ...

    for _ in range(3):
        limited.delay(1)  # (a line on one master: the view reads no line over the masters)
    with served_view(cluster_app) as served:
        answer = served.get("/api/waiting")
    assert answer.status_code == 200
    assert answer.json()["calls"] == []
    assert "Redis Cluster" in answer.json()["note"]


def test_the_eviction_check_reads_every_master(cluster_app: Celery, cluster: ClusterSet) -> None:
    store = dedupe.runs.runtime.runtime_of(cluster_app).store
    assert eviction_risk(store.client) is None
    evicting = cluster.masters()[-1]
    cluster.client(evicting).config_set("maxmemory", "1gb")
    cluster.client(evicting).config_set("maxmemory-policy", "volatile-lru")
    try:
        assert "maxmemory-policy=volatile-lru" in str(eviction_risk(store.client))
    finally:
        cluster.client(evicting).config_set("maxmemory", "0")


def test_a_failover_during_a_burst_of_calls_lets_no_duplicate_in(
    job: Any, cluster: ClusterSet
) -> None:
    args = _args_on_every_master(job, cluster, per_master=4)
    first = {x: job.delay(x).id for x in args}
    with Burst(job, args) as burst:
        time.sleep(0.3)
        cluster.failover(cluster.master_of_slot(_client(cluster).keyslot(_key(job, args[0]))))
        time.sleep(1.0)  # calls on the new master
    assert burst.errors == []
    assert burst.ids == {x: {first[x]} for x in args}  # every call of a key named its first id


def test_runs_keys_follow_their_runs_through_a_failover_and_are_freed_at_their_end(
    cluster_app: Celery, cluster: ClusterSet
) -> None:
    # Two runs, so the heartbeat renews their leases in one batch through the failover.
    cluster_app.conf.dedupe_default_lease = 3
    gate = threading.Event()

    @cluster_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def slow(x: int) -> None:
        gate.wait(30)

    first, second = _args_on_every_master(slow, cluster, per_master=1)[:2]
    with in_process_worker(cluster_app, pool="threads", concurrency=2):
        results = [slow.delay(first), slow.delay(second)]
        wait_for(
            lambda: all(
                (h := dedupe.lookup(slow, (x,))) is not None and h.state == "running"
                for x in (first, second)
            ),
            message="both running",
        )
        slot = _client(cluster).keyslot(results[0].keys.call)
        new_master = cluster.failover(cluster.master_of_slot(slot))
        time.sleep(3.5)  # past one lease: only renewals on the new master keep the keys
        holders: list[Any] = [dedupe.lookup(slow, (x,)) for x in (first, second)]
        assert [h.state if h else None for h in holders] == ["running", "running"]
        assert cluster.client(new_master).exists(results[0].keys.call)
        gate.set()
        for result in results:
            result.get(timeout=10)
        wait_for(
            lambda: all(dedupe.lookup(slow, (x,)) is None for x in (first, second)),
            timeout=5,
            message="freed",
        )


def test_a_slot_migrated_during_calls_lets_no_duplicate_in(job: Any, cluster: ClusterSet) -> None:
    slot, args = _args_in_one_slot(job, 8, start=1000)
    first = {x: job.delay(x).id for x in args[:4]}  # half the keys exist before the move
    source = cluster.master_of_slot(slot)
    target = next(port for port in cluster.masters() if port != source)
    with Burst(job, args) as burst:
        time.sleep(0.2)
        moved = cluster.migrate_slot(slot, target, pause=0.2)  # callers meet it half moved
        time.sleep(0.5)
    assert burst.errors == []
    assert moved >= 4
    assert all(burst.ids[x] == {first[x]} for x in args[:4])
    assert all(len(burst.ids[x]) == 1 for x in args[4:])  # a new key is accepted once, anywhere
    assert cluster.master_of_slot(slot) == target
    assert all(cluster.client(target).exists(_key(job, x)) for x in args)


def test_a_call_on_a_slot_that_moved_follows_the_redirect_at_once(
    job: Any, cluster: ClusterSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot, (x,) = _args_in_one_slot(job, 1, start=3000)
    first = job.delay(x)  # the runner of the slot's master is known now
    target = next(port for port in cluster.masters() if port != cluster.master_of_slot(slot))
    cluster.migrate_slot(slot, target)
    pauses: list[float] = []
    monkeypatch.setattr(dedupe.store.cluster_runner.time, "sleep", pauses.append)
    again = job.delay(x)  # MOVED from the old master
    assert (again.deduplicated, again.id) == (True, first.id)
    assert pauses == []


def test_a_batch_over_a_slot_that_moved_decides_every_call(job: Any, cluster: ClusterSet) -> None:
    slot, args = _args_in_one_slot(job, 3, start=4000)
    others = _args_on_every_master(job, cluster, per_master=1)
    first = {x: job.delay(x).id for x in args}
    target = next(port for port in cluster.masters() if port != cluster.master_of_slot(slot))
    cluster.migrate_slot(slot, target)
    results = dedupe.apply_many(job, [((x,), {}) for x in [*args, *others]])
    assert [(r.deduplicated, r.id) for r in results[:3]] == [(True, first[x]) for x in args]
    assert all(result.keys is not None for result in results)


def test_a_slot_no_master_serves_makes_its_calls_follow_the_policy(
    make_app: Callable[..., Celery], cluster: ClusterSet
) -> None:
    app = make_app(
        dedupe_redis_url=cluster.url, dedupe_on_redis_error="raise", dedupe_call_budget=1
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    slot, (x,) = _args_in_one_slot(job, 1, start=5000)
    job.delay(x + 1)  # the client knows the layout
    master = cluster.master_of_slot(slot)
    cluster.client(master).execute_command("CLUSTER", "DELSLOTS", slot)
    try:
        with pytest.raises(dedupe.RedisUnavailable):
            job.delay(x)
    finally:
        cluster.client(master).execute_command("CLUSTER", "ADDSLOTS", slot)
        cluster.settle()


def test_a_call_on_a_frozen_master_gives_up_within_its_budget(
    make_app: Callable[..., Celery], cluster: ClusterSet
) -> None:
    app = make_app(
        dedupe_redis_url=cluster.url,
        dedupe_on_redis_error="raise",
        dedupe_call_budget=1,
        dedupe_redis_options={"socket_timeout": 10, "socket_connect_timeout": 10},
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def frozen(x: int) -> None: ...

    frozen.delay(0)  # the client knows the cluster's layout
    master = cluster.master_of_slot(_client(cluster).keyslot(_key(frozen, 1)))
    server = cluster.servers[master]
    server.pause()
    try:
        began = time.monotonic()
        with pytest.raises(dedupe.RedisUnavailable):
            frozen.delay(1)
        took = time.monotonic() - began
    finally:
        server.resume()
    cluster.settle()
    assert took < 5  # well inside one 10 s socket timeout: the 1 s budget cut it short
