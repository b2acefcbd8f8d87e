"""The script runner: calls on a redis-py connection of each thread's own, answered as redis-py's
own client would answer them."""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import signal
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import redis
from redis._parsers import _HiredisParser, _RESP2Parser
from redis.backoff import NoBackoff
from redis.retry import Retry

from dedupe.store import deferred
from dedupe.store.connections import _poller
from dedupe.store.deferred import land_all
from dedupe.store.green_pool import GreenScriptRunner
from dedupe.store.script_runner import ScriptRunner
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import new_nonce, pack_queued

from .conftest import RedisFactory
from .helpers import exit_code_of_child, wait_for

# -- replies redis-py cannot read ---------------------------------------------------------------


class GarblingServer:
    """Answers every command +OK, and a script with bytes that are no reply at all: a server,
    proxy or cut stream gone out of step."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()[0]
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                count = data.count(b"*")  # (commands in the chunk: enough for a handshake)
                if b"EVALSHA" in data:
                    conn.sendall(b"?1\r\n+a\r\n")
                elif b"HELLO" in data:  # (redis-py 8 speaks RESP3 unless told otherwise)
                    conn.sendall(b"%1\r\n+proto\r\n:3\r\n")
                else:
                    conn.sendall(b"+OK\r\n" * count)

    def close(self) -> None:
        self.listener.close()


def test_a_reply_that_cannot_be_read_drops_the_connection_under_the_retry_policy() -> None:
    server = GarblingServer()
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 1))
    runner = ScriptRunner(client)
    try:
        with pytest.raises(redis.ConnectionError, match="unreadable reply"):
            runner(client.register_script(ECHO), [], ["x"])
        assert server.accepted == 2  # (tried again on a new connection, once)
        assert runner._local.connection is None
    finally:
        server.close()


# -- against a real Redis ----------------------------------------------------------------------

ECHO = "return ARGV[1]"
FAIL = "return redis.error_reply('ERR the script says no')"
DEMOTED = "return redis.error_reply('READONLY You cannot write against a read only replica.')"
SOMETIMES_DEMOTED = (
    "if ARGV[1] == 'no' then return redis.error_reply('READONLY You cannot write') end "
    "return ARGV[1]"
)
SLEEP = """
local stop = tonumber(redis.call('TIME')[1]) + 2
while tonumber(redis.call('TIME')[1]) < stop do end
return 1
"""


@pytest.fixture(scope="module")
def own_url(module_redis_factory: RedisFactory) -> str:
    """A Redis of this module's own: its tests kill connections, flush scripts and run
    scripts that stall the server, which no other test should meet."""
    return module_redis_factory().url


@pytest.fixture
def own_client(own_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_url)
    yield client
    client.close()


@pytest.fixture
def client(own_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_url, retry=Retry(NoBackoff(), 2))
    yield client
    client.close()


def run(runner: ScriptRunner, client: redis.Redis, source: str, *args: Any) -> Any:
    return runner(client.register_script(source), [], list(args))


def test_a_script_forgotten_by_the_server_is_loaded_and_run(
    client: redis.Redis, own_client: redis.Redis
) -> None:
    runner = ScriptRunner(client)
    own_client.script_flush()
    assert run(runner, client, ECHO, "hello") == b"hello"


def test_sends_in_flight_that_the_server_forgot_each_get_their_own_replies(
    client: redis.Redis, own_client: redis.Redis
) -> None:
    # After a restart both sends meet NOSCRIPT; the first's reload must not take the reply
    # meant for the second (it once read the second's NOSCRIPT as the load's answer, and
    # handed the load's answer, the script's SHA, to the second as its reply).
    runner = ScriptRunner(client)
    echo = client.register_script(ECHO)
    assert runner(echo, [], ["known"]) == b"known"  # sends go out only for known scripts
    own_client.script_flush()
    runner.send(echo, [], ["first"])
    second = runner.send(echo, [], ["second"], reply=True)
    third = runner.send(echo, [], ["third"], reply=True)
    assert second is not None
    assert third is not None
    assert runner.result(second) == b"second"
    assert runner.result(third) == b"third"
    assert run(runner, client, ECHO, "after") == b"after"


def test_a_send_left_unread_by_its_thread_is_read_by_the_sweeper_which_then_ends(
    client: redis.Redis, own_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deferred, "_SWEEPER_STAYS", 0.2)
    runner = ScriptRunner(client)
    setter = client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
    runner(setter, ["swept"], ["warm"])  # (the script known: the next send is not waited for)

    def send_and_end() -> None:
        runner.send(setter, ["swept"], ["sent"])

    thread = threading.Thread(target=send_and_end)
    thread.start()
    thread.join()
    # Landed: the reply read by the sweeper (the thread is gone), and the sweeper gone too.
    wait_for(lambda: not (runner._owing or runner._sweeping), message="the sweeper ended")
    assert own_client.get("swept") == b"sent"


def _giving_up_soon(
    redis_factory: RedisFactory, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, redis.Redis, ScriptRunner, Any]:
    """A server of its own, a fast-failing client and its runner, whose sweeper gives up on
    unanswered sends after 0.5 s; and a script that sets a key."""
    server = redis_factory()
    client = redis.Redis(
        port=server.port,
        socket_timeout=0.2,
        socket_connect_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )
    monkeypatch.setattr(deferred, "_GIVE_UP_AFTER", 0.5)
    monkeypatch.setattr(deferred, "_SWEEPER_STAYS", 0.2)
    setter = client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
    return server, client, ScriptRunner(client), setter


def test_the_sweeper_gives_up_on_a_redis_out_of_reach_and_ends(
    redis_factory: RedisFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server, client, runner, setter = _giving_up_soon(redis_factory, monkeypatch)
    # (However loaded the machine, the send is one not waited for.)
    monkeypatch.setattr(deferred, "TRUSTED_IDLE", 60.0)

    def warm_freeze_send() -> None:
        runner(setter, ["frozen"], ["warm"])  # (this thread's connection fresh: not waited on)
        server.pause()  # (frozen: the send is written, and no reply ever comes)
        runner.send(setter, ["frozen"], ["lost"])

    # (At this level whatever an earlier test's worker made of the root logger's.)
    with caplog.at_level(logging.WARNING, logger="dedupe.store"):
        try:
            thread = threading.Thread(target=warm_freeze_send)
            thread.start()
            thread.join()
            wait_for(lambda: not (runner._owing or runner._sweeping), message="sweeper ended")
        finally:
            server.resume()
            client.close()
    assert "given up" in caplog.text


def test_a_kept_reply_the_sweeper_gave_up_on_reads_as_a_lost_connection_not_an_answer(
    redis_factory: RedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client, runner, setter = _giving_up_soon(redis_factory, monkeypatch)
    outcome: list[BaseException | object] = []
    sent, read = threading.Event(), threading.Event()

    def send_then_read() -> None:
        runner(setter, ["frozen"], ["warm"])
        server.pause()  # (frozen: the send is written, and no reply ever comes)
        slot = runner.send(setter, ["frozen"], ["kept"], reply=True)
        assert slot is not None
        sent.set()
        read.wait(30)  # (until the sweeper gave it up and the server is back)
        try:
            outcome.append(runner.result(slot))
        except redis.ConnectionError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=send_then_read)
    try:
        thread.start()
        assert sent.wait(10)
        wait_for(lambda: not (runner._owing or runner._sweeping), message="sweeper gave up")
    finally:
        server.resume()
        read.set()
        thread.join()
        client.close()
    assert len(outcome) == 1
    assert isinstance(outcome[0], redis.ConnectionError), outcome


def test_land_all_waits_for_the_replies_a_thread_left_unread_as_a_process_exits(
    redis_factory: RedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a pool process does as it exits (worker_process_shutdown): its sweeper dies with
    # it (os._exit), so whatever is still unread is read now, waiting for it.
    server = redis_factory()
    client = redis.Redis(port=server.port, socket_timeout=2)
    monkeypatch.setattr(deferred, "TRUSTED_IDLE", 60.0)
    runner = ScriptRunner(client)
    setter = client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
    runner(setter, ["exiting"], ["warm"])
    server.pause()  # (the reply will come late: the sweeper cannot have read it)
    runner.send(setter, ["exiting"], ["landed"])
    threading.Timer(0.3, server.resume).start()
    try:
        land_all()
        assert not runner._local.pending
    finally:
        server.resume()
        client.close()
    check = redis.Redis(port=server.port)
    assert check.get("exiting") == b"landed"
    check.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (3.12+: fork with threads)
def test_a_forked_child_calls_though_a_thread_of_its_parent_held_the_runners_locks(
    client: redis.Redis,
) -> None:
    # A sweeper holds a connection's lock (and the runner's) while it reads; a fork at that
    # moment gives the child locks nobody in it will ever let go.
    runner = ScriptRunner(client)
    echo = client.register_script(ECHO)
    assert runner(echo, [], ["parent"]) == b"parent"
    local, held, let_go = runner._local, threading.Event(), threading.Event()

    def hold() -> None:
        with runner._owing_lock, local.lock:
            held.set()
            let_go.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: one call, then out
        try:
            os._exit(0 if runner(echo, [], ["child"]) == b"child" else 1)
        except BaseException:
            os._exit(2)
    let_go.set()
    holder.join()
    code = exit_code_of_child(pid)
    if code is None:
        pytest.fail("the child's call hung on a lock its parent's thread held at the fork")
    assert code == 0


def test_an_error_reply_raises_and_leaves_the_connection_usable(client: redis.Redis) -> None:
    runner = ScriptRunner(client)
    with pytest.raises(redis.ResponseError, match="the script says no"):
        run(runner, client, FAIL)
    assert run(runner, client, ECHO, "after") == b"after"


def test_a_readonly_reply_drops_the_connection_so_the_retry_reconnects(
    own_url: str, own_client: redis.Redis
) -> None:
    # A master demoted by a failover, still connected: only a new connection (through
    # Sentinel, to the new master) can write again.
    client = redis.Redis.from_url(
        own_url, client_name="runner-demoted", retry=Retry(NoBackoff(), 1)
    )
    runner = ScriptRunner(client)
    assert run(runner, client, ECHO, "before") == b"before"
    (first,) = [c["id"] for c in own_client.client_list() if c["name"] == "runner-demoted"]
    with pytest.raises(redis.ConnectionError, match="a replica now"):
        run(runner, client, DEMOTED)
    assert run(runner, client, ECHO, "after") == b"after"
    now = [c["id"] for c in own_client.client_list() if c["name"] == "runner-demoted"]
    assert first not in now
    client.close()


def test_a_readonly_reply_in_a_pipelined_batch_drops_the_connection_too(
    own_url: str, own_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(own_url, client_name="batch-demoted", retry=Retry(NoBackoff(), 1))
    runner = ScriptRunner(client)
    sometimes = client.register_script(SOMETIMES_DEMOTED)
    assert runner.call_many(sometimes, [([], ["yes"])]) == [b"yes"]  # loaded: pipelined now
    (first,) = [c["id"] for c in own_client.client_list() if c["name"] == "batch-demoted"]
    with pytest.raises(redis.ConnectionError, match="a replica now"):
        runner.call_many(sometimes, [([], ["yes"]), ([], ["no"])])
    assert run(runner, client, ECHO, "after") == b"after"
    now = [c["id"] for c in own_client.client_list() if c["name"] == "batch-demoted"]
    assert first not in now
    client.close()


def test_a_connection_killed_by_the_server_is_replaced_under_the_retry_policy(
    own_url: str, own_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(own_url, client_name="runner-killed", retry=Retry(NoBackoff(), 2))
    runner = ScriptRunner(client)
    assert run(runner, client, ECHO, "before") == b"before"
    (mine,) = [c for c in own_client.client_list() if c["name"] == "runner-killed"]
    own_client.client_kill_filter(_id=mine["id"])  # only this one: the server is shared
    assert run(runner, client, ECHO, "after") == b"after"
    client.close()


def test_a_reply_slower_than_the_socket_timeout_raises_redis_timeout_error(
    own_url: str, own_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(own_url, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    runner = ScriptRunner(client)
    with pytest.raises(redis.TimeoutError):
        run(runner, client, SLEEP)
    own_client.ping()  # answered once the slow script is done
    assert run(runner, client, ECHO, "next") == b"next"  # on a fresh connection
    client.close()


class SilentServer:
    """Accepts connections and never answers: a frozen Redis, as its clients see it (the
    kernel still completes their connects). Counts the connections it was offered."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.listener.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def test_a_frozen_redis_is_tried_once_per_try_of_the_retry_policy(silent: SilentServer) -> None:
    # redis-py's connect retries and health checks must not nest inside the runner's policy:
    # each nesting multiplies the time a call blocks on a frozen Redis.
    client = redis.Redis.from_url(
        silent.url,
        socket_timeout=0.1,
        socket_connect_timeout=0.1,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 2),
    )
    with pytest.raises(redis.TimeoutError):
        run(ScriptRunner(client), client, ECHO, "lost")
    assert len(silent.accepted) == 3


def test_scripts_run_over_a_resp3_connection(own_url: str) -> None:
    client = redis.Redis.from_url(own_url, protocol=3)
    runner = ScriptRunner(client)
    assert run(runner, client, ECHO, "three") == b"three"
    assert run(runner, client, "return 7") == 7
    client.close()


def test_each_thread_talks_on_its_own_connection(own_url: str, own_client: redis.Redis) -> None:
    client = redis.Redis.from_url(own_url, client_name="runner-threads")
    runner = ScriptRunner(client)
    all_called = threading.Barrier(4)

    def call() -> None:
        assert run(runner, client, ECHO, "x") == b"x"
        all_called.wait(timeout=10)  # stay alive (and connected) until counted
        all_called.wait(timeout=10)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    all_called.wait(timeout=10)
    named = [c for c in own_client.client_list() if c["name"] == "runner-threads"]
    all_called.wait(timeout=10)
    for thread in threads:
        thread.join()
    client.close()
    assert len(named) == 3


def test_threads_beyond_the_pools_max_connections_share_its_connections(
    own_url: str, own_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(own_url, client_name="runner-capped", max_connections=3)
    runner = ScriptRunner(client, busy_poll=50e-6)
    all_called = threading.Barrier(9)
    wrong: list[tuple[str, Any]] = []

    def call(name: str) -> None:
        all_called.wait(timeout=10)
        for n in range(300):  # (calls of threads that share a connection, interleaved)
            word = f"{name}-{n}"
            answer = run(runner, client, ECHO, word)
            if answer != word.encode():
                wrong.append((word, answer))
        all_called.wait(timeout=10)  # stay alive (and connected) until counted
        all_called.wait(timeout=10)

    threads = [threading.Thread(target=call, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    all_called.wait(timeout=10)
    all_called.wait(timeout=60)
    named = [c for c in own_client.client_list() if c["name"] == "runner-capped"]
    all_called.wait(timeout=10)
    for thread in threads:
        thread.join()
    client.close()
    assert len(named) == 3
    assert wrong == []


def test_a_child_forked_at_the_cap_calls_though_its_parents_threads_held_the_connections(
    own_url: str,
) -> None:
    # At the cap a new thread shares a connection; in a forked child the parent's connections
    # (and locks its threads held at the fork) are not there to share.
    client = redis.Redis.from_url(own_url, max_connections=1)
    runner = ScriptRunner(client)
    echo = client.register_script(ECHO)
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        assert runner(echo, [], ["parent"]) == b"parent"  # the one connection: this thread's
        with runner._local.lock:
            held.set()
            let_go.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: one call from a new thread, then out
        answers: list[Any] = []
        thread = threading.Thread(target=lambda: answers.append(runner(echo, [], ["child"])))
        thread.start()
        thread.join(10)
        os._exit(0 if answers == [b"child"] else 1)
    let_go.set()
    holder.join()
    code = exit_code_of_child(pid)
    client.close()
    if code is None:
        pytest.fail("the child's new thread hung on a connection its parent's thread held")
    assert code == 0


# -- polling for a reply before sleeping for it ------------------------------------------------

SLOW = """
local stop = tonumber(ARGV[1])
local now = redis.call('TIME')
local start = now[1] * 1000000 + now[2]
repeat now = redis.call('TIME') until now[1] * 1000000 + now[2] - start >= stop
return 'slow'
"""


def test_a_reply_slower_than_the_poll_budget_is_read_all_the_same(client: redis.Redis) -> None:
    runner = ScriptRunner(client, busy_poll=50e-6)
    assert run(runner, client, SLOW, 20_000) == b"slow"  # 20 ms: 400 times the budget


def test_replies_that_outlast_the_budget_make_a_thread_poll_less_often(
    client: redis.Redis,
) -> None:
    # A budget no fast reply misses, even on a loaded machine, and slow replies ten times it.
    runner = ScriptRunner(client, busy_poll=0.02)
    run(runner, client, ECHO, "loaded")  # (the script loaded: polls that are answered)
    run(runner, client, SLOW, 200_000)
    assert runner._local.poll_skips == 1  # the next call sleeps at once
    run(runner, client, SLOW, 200_000)  # (skipped polling)
    run(runner, client, SLOW, 200_000)
    assert runner._local.poll_skips == 3  # a second miss in a row: the next three
    for _ in range(3):
        run(runner, client, ECHO, "skipped")
    run(runner, client, ECHO, "polled")  # polled, and answered within the budget
    assert (runner._local.poll_skips, runner._local.poll_misses) == (0, 0)


def test_no_budget_means_no_polling(client: redis.Redis) -> None:
    runner = ScriptRunner(client, busy_poll=0)
    assert run(runner, client, ECHO, "asleep") == b"asleep"
    assert runner._local.poll is False


def test_only_a_plain_sockets_lone_reply_is_polled_for_on_the_socket(
    client: redis.Redis,
) -> None:
    class GreenSocket(socket.socket):  # what gevent and eventlet put in socket's place
        pass

    class Connected:  # (a connection as _poller looks at it)
        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock

    with GreenSocket() as green, socket.socket() as plain:
        assert _poller(Connected(green)) is None  # (polled through redis-py's can_read)
        assert _poller(Connected(plain)) is not None


#: The parsers a reply is read with: hiredis's (redis-py's default where it is installed, as it
#: is here) and redis-py's own.
PARSERS = {"hiredis": _HiredisParser, "redis-py": _RESP2Parser}


@pytest.mark.parametrize("parser", PARSERS)
def test_replies_that_came_in_one_read_are_not_polled_for(own_url: str, parser: str) -> None:
    # The socket has nothing more to say of a reply the parser holds already: polling it
    # would spin the whole budget, and count a miss.
    client = redis.Redis.from_url(own_url, parser_class=PARSERS[parser], protocol=2)
    runner = ScriptRunner(client, busy_poll=0.05)
    echo = client.register_script(ECHO)
    run(runner, client, ECHO, "loaded")
    for _ in range(5):
        replies = runner.call_many(echo, [([], [str(n)]) for n in range(20)])
        assert replies == [str(n).encode() for n in range(20)]
    assert (runner._local.poll_skips, runner._local.poll_misses) == (0, 0)


def test_a_greenlet_never_spins_on_its_connection_for_a_reply(client: redis.Redis) -> None:
    # (A busy poll in a greenlet keeps every other greenlet of its thread from running.)
    assert GreenScriptRunner(client, busy_poll=100e-6)._busy_poll == 0


# -- an exchange interrupted by an exception (a signal handler's) ------------------------------


class _Interrupted(Exception):
    """What a signal handler raises mid-call (Celery's SoftTimeLimitExceeded, an alarm)."""


class _Alarm:
    #: Between the alarm's arming and the end of the calls it may cut (a handler that Python
    #: runs a little late, after the timer was disarmed, must not cut the next round).
    armed = False


def _interrupt(signum: int, frame: Any) -> None:
    if _Alarm.armed:
        raise _Interrupted


def _caused_by_the_alarm(exc: BaseException | None) -> bool:
    # (redis-py 5.0's Connection.__init__, interrupted in its protocol check, raises an
    # UnboundLocalError from its finally clause, the interruption as its context.)
    while exc is not None:
        if isinstance(exc, _Interrupted):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _interrupted_calls(url: str, busy_poll: float) -> tuple[int, list[Any]]:
    """1,500 Store calls, each with an alarm set to go off somewhere inside it, then 40
    enqueues of new keys: (calls interrupted, the 40 answers)."""
    client = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 2))
    store = Store(client, busy_poll=busy_poll, remember_duplicates=1.0)
    prefix = f"interrupted-{busy_poll}"
    rounds = random.Random(29)
    interrupted = 0
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        for index in range(1500):
            keys = CallKeys.of(f"{prefix}:{{t:{index % 20}}}", separate_run_lock=False)
            # (Another task id each time: a held key answers with its holder, and its second
            # duplicate is asked behind CLIENT CACHING YES.)
            record = pack_queued(f"task-{index}", 0.0, None, new_nonce())
            try:
                # From before the send to after the reply: an alarm may land in sendall,
                # which runs the handler once the bytes are out, or between two steps.
                _Alarm.armed = True
                signal.setitimer(signal.ITIMER_REAL, rounds.uniform(1e-6, 2e-4))
                store.enqueue(keys, record, 60_000, remember=True)
                if index % 5 == 0:
                    store.send_release(keys, f"task-{index}", "")
                _Alarm.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            except Exception as exc:
                _Alarm.armed = False
                if not _caused_by_the_alarm(exc):
                    raise
                interrupted += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    fresh = [CallKeys.of(f"{prefix}:{{new:{n}}}", separate_run_lock=False) for n in range(40)]
    record = pack_queued("after", 0.0, None, new_nonce())
    return interrupted, [store.enqueue(keys, record, 60_000) for keys in fresh]


# The alarms land anywhere, in other libraries' code too: in logging's getLogger (redis-py's
# handshake calls it) between taking logging's lock and its try, which leaves that lock taken
# for good, and every later log call of the process hangs (a later test did). So the calls
# run in a process of their own.
@pytest.mark.parametrize("busy_poll", [0.0, 0.0001], ids=["sleeping", "polling"])
def test_calls_interrupted_anywhere_leave_no_reply_for_a_later_call(
    own_url: str, busy_poll: float
) -> None:
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as child:
        interrupted, answers = child.submit(_interrupted_calls, own_url, busy_poll).result(120)
    assert interrupted > 0
    assert answers == [None] * 40  # each a new key: accepted, whatever came before
