"""The chaos harness's reading of the Redis broker's command log (tests/chaos/broker_log.py):
which messages kombu popped and never recorded as unacked, and at which kill or cut."""

from __future__ import annotations

from tests.chaos.broker_log import Unrecorded, only_lost, popped_at, unrecorded
from tests.chaos.evidence import Fault

QUEUE = "chaosrun-q"
A, B, C = (f"{c * 8}-0000-0000-0000-000000000000" for c in "abc")


def _message(task_id: str) -> str:
    # A Celery protocol 2 message as redis-cli monitor quotes it (root_id first: not the id).
    return (
        f'"{{\\"body\\": \\"W10=\\", \\"headers\\": {{\\"root_id\\": \\"{C}\\", '
        f'\\"id\\": \\"{task_id}\\", \\"task\\": \\"t\\"}}}}"'
    )


def _push(at: float, task_id: str, command: str = "LPUSH") -> str:
    return f'{at:.6f} [0 127.0.0.1:5000] "{command}" "{QUEUE}" {_message(task_id)}'


def _recorded(at: float, task_id: str) -> str:
    value = f'"[{_message(task_id)[1:-1]}, \\"\\", \\"q\\"]"'
    return f'{at:.6f} [0 127.0.0.1:5001] "HSET" "unacked" "tag-{task_id[:4]}" {value}'


def test_a_message_pushed_and_never_recorded_as_unacked_was_popped_and_lost() -> None:
    lines = [_push(1.0, A), _push(1.1, B), _recorded(1.5, B)]
    assert unrecorded(lines, QUEUE) == [Unrecorded(A, 1.0, 1.5)]


def test_a_message_recorded_after_its_last_push_is_not_lost() -> None:
    lines = [_push(1.0, A), _recorded(1.2, A), _push(2.0, A, "RPUSH"), _recorded(2.1, A)]
    assert unrecorded(lines, QUEUE) == []


def test_a_message_sent_again_and_not_recorded_after_its_last_push_is_lost() -> None:
    # A deferred or early delivery sends its task id again: only its last push counts.
    lines = [_push(1.0, A), _recorded(1.2, A), _push(2.0, A)]
    assert unrecorded(lines, QUEUE) == [Unrecorded(A, 2.0, None)]


def test_the_pop_bound_is_a_later_pushed_message_s_record_after_its_own_push() -> None:
    # B's record at 0.5 s came before its push at 1.1 s (an earlier delivery): no bound.
    lines = [_recorded(0.5, B), _push(1.0, A), _push(1.1, B), _recorded(3.0, B)]
    assert unrecorded(lines, QUEUE) == [Unrecorded(A, 1.0, 3.0)]


def test_other_queues_and_other_commands_are_not_read() -> None:
    lines = [
        _push(1.0, A).replace(QUEUE, "other-q"),
        f'1.2 [0 127.0.0.1:5000] "LRANGE" "{QUEUE}" "0" "-1"',
        "OK",
    ]
    assert unrecorded(lines, QUEUE) == []


KILL = Fault("worker kill", 2.0, 2.3, "worker 0")
CHILD = Fault("child kill", 1.5, 1.6, "child")


def test_a_lost_message_vanished_at_the_first_kill_after_its_push() -> None:
    faults = popped_at([CHILD, KILL], [Unrecorded(A, 1.0, 1.8)], held=set())
    assert faults[1].vanished == {A}
    assert faults[0].vanished == frozenset()  # (a child's kill pops nothing)


def test_a_message_popped_long_before_the_kill_is_left_to_fail() -> None:
    # Its pop came before 0.5 s (the next message's record): no kill took it then.
    assert popped_at([KILL], [Unrecorded(A, 0.2, 0.5)], held=set())[0].vanished == frozenset()


def test_a_message_pushed_after_the_last_kill_or_still_held_is_left_out() -> None:
    assert popped_at([KILL], [Unrecorded(A, 2.5, None)], held=set())[0].vanished == frozenset()
    assert popped_at([KILL], [Unrecorded(A, 1.0, None)], held={A})[0].vanished == frozenset()


def test_the_drain_stops_waiting_when_only_lost_messages_keys_are_left() -> None:
    lost = [Unrecorded(A, 1.0, None)]
    assert only_lost([f"p:{{t:k}} ttl 3599s held by {A}"], lost)
    assert not only_lost([f"p:{{t:k}} ttl 3599s held by {A}", f"p:{{t:j}} held by {B}"], lost)
    assert not only_lost([f"p:{{t:k}}:line ttl 60s member {B} ticket 3"], [])
