"""The chaos run's judgement (tests/chaos/evidence.py), on evidence written by hand: when
an accepted call stops holding its key, and what of a call that never ran is kombu's."""

from __future__ import annotations

from typing import Any

from tests.chaos.evidence import LIMITED, PACED, RATED, Call, Checks, Evidence, Fault

HOLDER, LATER = "aaaaaaaa-holder", "bbbbbbbb-later"


def _judged(calls: list[Call], broker: str = "redis", **found: Any) -> Checks:
    """The checks on evidence written by hand: ``calls``, and whatever of the rest a test
    names (none of it by default)."""
    nothing: dict[str, Any] = {
        "runs": {},
        "completed": {},
        "overlaps": {},
        "prerun": {},
        "faults": [],
        "keys_left": [],
        "t0": 0.0,
    }
    evidence = Evidence(calls=calls, **{**nothing, **found})
    return Checks(evidence, restart_window=20.0, broker=broker)


def _checks(
    prerun: list[tuple[float, int]],
    deferred: list[tuple[float, int]],
    runs: list[tuple[float, float]],
    later_call_at: float,
) -> Checks:
    """The holder, accepted at 1 s: its deliveries' preruns, the ones deferred, and the runs
    whose body started; the later call of the same key, accepted at ``later_call_at``."""
    calls = [
        Call("started", 1, HOLDER, False, 1.0, 1.0),
        Call("started", 1, LATER, False, later_call_at, later_call_at),
    ]
    return _judged(
        calls,
        runs={("started", 1): [(HOLDER, start, end) for start, end in runs]},
        completed={HOLDER: [end for _, end in runs]},
        prerun={HOLDER: prerun},
        deferred={HOLDER: deferred},
    )


def test_a_claim_killed_before_the_body_started_frees_the_started_key_at_its_prerun() -> None:
    # Delivered at 5 s to child 10, which claimed (freeing the call's key) and was killed
    # before the body wrote its start; redelivered at 20 s. A call at 6 s is no duplicate.
    checks = _checks(
        prerun=[(5.0, 10), (20.0, 11)], deferred=[], runs=[(20.1, 20.5)], later_call_at=6.0
    )
    assert checks.duplicates() == []
    assert "1 killed before its body" in checks.history(HOLDER)


def test_a_deferred_delivery_leaves_the_started_key_with_its_call() -> None:
    # Delivered at 5 s and deferred (its claim was held): the call still holds its key.
    checks = _checks(
        prerun=[(5.0, 10), (20.0, 11)],
        deferred=[(5.01, 10)],
        runs=[(20.1, 20.5)],
        later_call_at=6.0,
    )
    assert [(a.task_id, b.task_id) for a, b in checks.duplicates()] == [(HOLDER, LATER)]
    assert checks.deferrals(HOLDER) == 1


def test_a_deferral_in_another_child_does_not_stand_for_this_childs_delivery() -> None:
    # Child 10 claimed at 5 s and was killed; child 12 deferred a later delivery at 7 s.
    checks = _checks(
        prerun=[(5.0, 10), (7.0, 12), (20.0, 11)],
        deferred=[(7.01, 12)],
        runs=[(20.1, 20.5)],
        later_call_at=6.0,
    )
    assert checks.duplicates() == []


def test_a_delivery_that_ran_is_a_claim_though_its_child_defers_a_later_one() -> None:
    # Child 10 claimed at 5 s and ran; at 20 s the same child got the message again (its ack
    # lost) and deferred it. The 20 s deferral is that delivery's, not the 5 s one's: a call
    # at 5.5 s came after the claim freed the started key.
    checks = _checks(
        prerun=[(5.0, 10), (20.0, 10)],
        deferred=[(20.01, 10)],
        runs=[(5.01, 5.2)],
        later_call_at=5.005,
    )
    assert checks.duplicates() == []
    assert checks.deferrals(HOLDER) == 1


def _never_run(
    faults: list[Fault],
    prerun: dict[str, list[tuple[float, int]]] | None = None,
    keys_left: list[str] | None = None,
    freed: dict[str, list[tuple[float, int]]] | None = None,
) -> Checks:
    """The holder, accepted at 1 s, its body never started; ``prerun``: its deliveries to a
    child; ``keys_left``: the keys left after the drain; ``freed``: when a worker's main
    process freed its key for a run it lost."""
    return _judged(
        [Call("finished", 4, HOLDER, False, 1.0, 1.0)],
        prerun=prerun or {},
        faults=faults,
        keys_left=keys_left or [],
        freed=freed or {},
    )


def _never_ran(
    faults: list[Fault],
    prerun: dict[str, list[tuple[float, int]]] | None = None,
    freed: dict[str, list[tuple[float, int]]] | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """The rows the holder lands in (ours, kombu's, Celery's)."""
    ours, kombu, celery = _never_run(faults, prerun, freed=freed).never_ran_rows()
    return ours.details, kombu.details, celery.details


def test_an_accepted_call_that_never_ran_is_a_failure_of_ours() -> None:
    ours, kombu, _ = _never_ran([Fault("broker cut", 2.0, 5.0, "redis down 3s")])
    assert len(ours) == 1
    assert kombu == []


def test_a_message_that_left_the_queue_at_a_broker_cut_and_never_ran_is_kombus_loss() -> None:
    # In the queue just before the cut, in neither the queue nor the unacked hash after it:
    # a worker's BRPOP took it as the server shut down, and kombu never recorded it.
    cut = Fault("broker cut", 2.0, 5.0, "redis down 3s", frozenset({HOLDER}))
    ours, kombu, _ = _never_ran([cut])
    assert ours == []
    assert len(kombu) == 1
    assert "before the broker cut" in kombu[0]


def test_a_message_that_reached_a_child_before_it_left_the_queue_stays_a_failure_of_ours() -> None:
    # Its prerun was written: the worker had it, so what became of it is no transport loss.
    cut = Fault("broker cut", 2.0, 5.0, "redis down 3s", frozenset({HOLDER}))
    ours, kombu, _ = _never_ran([cut], prerun={HOLDER: [(1.5, 10)]})
    assert len(ours) == 1
    assert kombu == []


def test_the_key_of_a_message_kombu_lost_is_shown_apart_and_any_other_key_left_fails() -> None:
    cut = Fault("broker cut", 2.0, 5.0, "redis down 3s", frozenset({HOLDER}))
    left = [
        f"p:{{finished:1}} ttl 3500s held by {HOLDER}",
        f"p:{{finished:2}} ttl 3500s held by {LATER}",
    ]
    ours, kombu = _never_run([cut], keys_left=left).keys_left_rows()
    assert (ours.verdict, ours.details) == ("FAIL", [left[1]])
    assert (kombu.verdict, kombu.details) == ("not ours", [left[0]])


def test_the_tombstone_of_an_ended_debounced_run_is_no_key_left() -> None:
    left = [f"p:{{t.debounced:ab}}:ran ttl 3702s ended run of {HOLDER} retries 0"]
    ours, _ = _never_run([], keys_left=left).keys_left_rows()
    assert ours.verdict == "ok"


def test_the_marks_of_a_limited_calls_copies_are_no_record_left() -> None:
    # A call handed a slot twice, or kept with a copy in the broker, drops its later copies
    # for a while: the limits' rows show the mark (it lives its ttl), it is no record.
    left = [
        f"p:{{t.limited:ab}}:started ttl 3500s member {HOLDER} at +3400.00s",
        f"p:{{t.limited:ab}}:started ttl 3500s member {HOLDER} copy at +3400.00s",
    ]
    ours, _ = _never_run([], keys_left=left).keys_left_rows()
    assert ours.verdict == "ok"


def test_a_call_answered_with_a_message_kombu_lost_is_shown_apart_and_any_other_lost_fails() -> (
    None
):
    # The holder's message left the queue at the cut and never ran: every call of its key
    # answered with it is kombu's loss; a call answered with a task that simply never ran,
    # ours.
    cut = Fault("broker cut", 2.0, 5.0, "redis down 3s", frozenset({HOLDER}))
    checks = _judged(
        [
            Call("started", 1, HOLDER, False, 1.0, 1.0),
            Call("started", 1, HOLDER, True, 1.5, 1.5),
            Call("started", 2, LATER, False, 1.0, 1.0),
        ],
        faults=[cut],
    )
    ours, kombu = checks.lost_rows()
    assert ours.verdict == "FAIL"
    assert [line.split(" ")[0] for line in ours.details] == ["started[2]"]
    assert kombu.verdict == "not ours"
    assert len(kombu.details) == 2


def _lost_then_redelivered(duplicate_at: float, freed_at: float | None) -> Checks:
    """The holder (``finished``, accepted at 1 s) ran at 2 s in a child killed at 2.5 s, and
    again from 7.6 s to 7.8 s; its worker's main process freed its key at ``freed_at``
    (Celery acking the lost run as failed); a later call of its key, accepted at
    ``duplicate_at``."""
    return _judged(
        [
            Call("finished", 2, HOLDER, False, 1.0, 1.0),
            Call("finished", 2, LATER, False, duplicate_at, duplicate_at),
        ],
        broker="amqp",
        runs={("finished", 2): [(HOLDER, 2.0, 2.5), (HOLDER, 7.6, 7.8), (LATER, 8.0, 8.1)]},
        completed={HOLDER: [7.8], LATER: [8.1]},
        freed={HOLDER: [(freed_at, 10)]} if freed_at is not None else {},
    )


def test_a_run_after_a_lost_run_acked_as_failed_is_the_message_again_not_a_holder() -> None:
    # The main process freed the key at 7.5 s as Celery acked the lost run; the worker was
    # killed before RabbitMQ had the ack, and the message came back at 7.6 s. A call at
    # 7.52 s found the key free, as the library had every reason to leave it.
    checks = _lost_then_redelivered(duplicate_at=7.52, freed_at=7.5)
    assert checks.duplicates() == []
    assert (
        "acked as failed and its key freed 7.50s, ran again 7.60s" in checks.rerun_row().details[0]
    )


def test_a_call_before_the_lost_runs_key_was_freed_is_still_a_duplicate() -> None:
    checks = _lost_then_redelivered(duplicate_at=5.0, freed_at=7.5)
    assert [(a.task_id, b.task_id) for a, b in checks.duplicates()] == [(HOLDER, LATER)]


def test_a_run_after_a_lost_run_whose_key_nobody_freed_holds_the_key_until_it_completes() -> None:
    # (A whole-worker kill: no main process freed the key; the message came back unacked.)
    checks = _lost_then_redelivered(duplicate_at=7.52, freed_at=None)
    assert [(a.task_id, b.task_id) for a, b in checks.duplicates()] == [(HOLDER, LATER)]


def test_a_message_whose_child_was_killed_before_its_run_began_is_celerys_ack_as_failed() -> None:
    # The main process freed its key as Celery acked the message as failed (WorkerLostError,
    # no reject_on_worker_lost): the record went with the message.
    kill = Fault("child kill", 2.0, 2.0, "child 10 of worker 0")
    ours, kombu, celery = _never_ran([kill], freed={HOLDER: [(2.01, 5)]})
    assert ours == []
    assert kombu == []
    assert len(celery) == 1


# -- the debounced task ---------------------------------------------------------------------

BURST, NEXT = "cccccccc-burst", "dddddddd-next"


def _burst(*args: int, at: float = 1.0, gap: float = 0.1, task_id: str = BURST) -> list[Call]:
    """A burst of debounced calls of key 3 (arguments ``args``) from ``at``, ``gap`` apart:
    the first accepted, the others answered with its task id."""
    return [
        Call("debounced", 3, task_id, index > 0, at + index * gap, at + index * gap, arg=arg)
        for index, arg in enumerate(args)
    ]


def _debounced(
    calls: list[Call],
    ran: dict[str, list[tuple[float, int, int]]],
    prerun: dict[str, list[tuple[float, int]]],
    retried: dict[str, list[tuple[float, int]]] | None = None,
    **found: Any,
) -> Checks:
    """Debounced evidence: ``ran`` (task id -> (body start, argument, pid)), each run also
    written to the run log of key 3 (0.1 s long); ``prerun`` and ``retried`` as the worker
    wrote them."""
    runs = [(task_id, at, at + 0.1) for task_id, times in ran.items() for at, _, _ in times]
    completed: dict[str, list[float]] = {}
    for task_id, _, end in runs:
        completed.setdefault(task_id, []).append(end)
    return _judged(
        calls,
        runs={("debounced", 3): sorted(runs, key=lambda run: run[1])},
        completed=completed,
        prerun=prerun,
        retried=retried or {},
        ran=ran,
        **found,
    )


def _row(checks: Checks, name: str) -> Any:
    return next(row for row in checks.debounce_rows() if row.check == name)


SECOND_BURST = "debounced: a second burst accepted while the first was queued"


def test_a_second_burst_accepted_before_the_first_claimed_fails_and_after_it_passes() -> None:
    # The burst's message came early at 1.3 s (sent again: no claim) and claimed at 1.6 s.
    def checks(next_at: float) -> Checks:
        return _debounced(
            _burst(1, 2) + _burst(3, at=next_at, task_id=NEXT),
            ran={BURST: [(1.61, 2, 10)], NEXT: [(next_at + 0.5, 3, 10)]},
            prerun={BURST: [(1.3, 10), (1.6, 10)], NEXT: [(next_at + 0.49, 10)]},
            retried={BURST: [(1.31, 10)]},
        )

    bad = _row(checks(1.4), SECOND_BURST)
    assert (bad.verdict, bad.count) == ("FAIL", 1)
    assert NEXT in bad.details[0]
    assert _row(checks(1.7), SECOND_BURST).verdict == "ok"


def test_overlapping_debounced_runs_fail_their_own_row() -> None:
    calls = _burst(1) + _burst(2, at=3.0, task_id=NEXT)
    pair = ((BURST, 1.3, 1.6), (NEXT, 1.5, 1.7))
    name = "debounced: overlapping runs of one key"
    bad = _judged(calls, overlaps={("debounced", 3): [pair]})
    assert _row(bad, name).verdict == "FAIL"
    assert bad.overlap_row().verdict == "ok"  # (the dedup tasks' row is theirs alone)
    assert _row(_judged(calls, overlaps={("debounced", 3): []}), name).verdict == "ok"


STALE = "debounced: runs with older arguments than a call for them left before the claim"
BY_DESIGN = "debounced: runs with their message's arguments, by design (below)"


def test_a_run_with_older_arguments_than_its_burst_left_before_its_claim_fails() -> None:
    # Calls of 1, 2, 3 (1.0-1.2 s), the claim's prerun at 1.6 s: the run must have 3.
    def checks(arg: int) -> Checks:
        return _debounced(
            _burst(1, 2, 3), ran={BURST: [(1.61, arg, 10)]}, prerun={BURST: [(1.6, 10)]}
        )

    bad = _row(checks(2), STALE)
    assert (bad.verdict, bad.count) == ("FAIL", 1)
    assert "with 2" in bad.details[0]
    assert "call of 3" in bad.details[0]
    assert _row(checks(3), STALE).verdict == "ok"


def test_a_redelivery_after_another_burst_took_has_its_messages_arguments_by_design() -> None:
    # Claimed at 1.6 s (took 3), killed; the next burst (4, 5) claimed at 10 s and took 5,
    # replacing the hash's last take; the first message again at 20 s: its take finds
    # nothing of its own and the run has the message's argument, 1. Shown, not failed.
    def checks(next_burst: bool) -> Checks:
        calls = _burst(1, 2, 3) + (_burst(4, 5, at=9.0, task_id=NEXT) if next_burst else [])
        ran = {BURST: [(1.61, 3, 10), (20.01, 1, 11)]}
        prerun = {BURST: [(1.6, 10), (20.0, 11)]}
        if next_burst:
            ran[NEXT], prerun[NEXT] = [(10.01, 5, 12)], [(10.0, 12)]
        return _debounced(calls, ran=ran, prerun=prerun)

    assert _row(checks(next_burst=True), STALE).verdict == "ok"
    by_design = _row(checks(next_burst=True), BY_DESIGN)
    assert (by_design.verdict, by_design.count) == ("info", 1)
    assert "an earlier delivery of it claimed at 1.60s" in by_design.details[0]
    # No other take since: the hash's last take answers the message again with 3.
    assert _row(checks(next_burst=False), STALE).verdict == "FAIL"


def test_a_dedup_restart_that_lost_the_latest_arguments_leaves_the_message_s_by_design() -> None:
    restart = Fault("dedup restart", 1.3, 1.35, "data lost")
    checks = _debounced(
        _burst(1, 2, 3),
        ran={BURST: [(1.61, 1, 10)]},
        prerun={BURST: [(1.6, 10)]},
        faults=[restart],
    )
    assert _row(checks, STALE).verdict == "ok"
    assert "restart at 1.30s lost them" in _row(checks, BY_DESIGN).details[0]
    # A restart before the calls lost nothing of theirs: no excuse.
    early = Fault("dedup restart", 0.5, 0.55, "data lost")
    checks = _debounced(
        _burst(1, 2, 3), ran={BURST: [(1.61, 1, 10)]}, prerun={BURST: [(1.6, 10)]}, faults=[early]
    )
    assert _row(checks, STALE).verdict == "FAIL"


def test_a_dedup_restart_between_the_prerun_and_the_body_may_come_before_the_take() -> None:
    # Seen: prerun at 9.33 s, the restart at 9.37 s, the take after it (found nothing), the
    # body at 9.43 s with the message's argument. A restart after the body is no excuse.
    def checks(restart_at: float) -> Checks:
        return _debounced(
            _burst(1, 2, 3),
            ran={BURST: [(1.7, 1, 10)]},
            prerun={BURST: [(1.6, 10)]},
            faults=[Fault("dedup restart", restart_at, restart_at + 0.01, "data lost")],
        )

    assert _row(checks(1.65), STALE).verdict == "ok"
    assert "restart at 1.65s lost them" in _row(checks(1.65), BY_DESIGN).details[0]
    assert _row(checks(1.75), STALE).verdict == "FAIL"


def test_a_run_with_an_argument_no_call_of_its_task_id_made_fails() -> None:
    name = "debounced: runs with an argument no call of their task id made"

    def checks(arg: int) -> Checks:
        calls = _burst(1, 2, 3) + _burst(7, at=5.0, task_id=NEXT)
        return _debounced(
            calls,
            ran={BURST: [(1.61, arg, 10)], NEXT: [(5.5, 7, 10)]},
            prerun={BURST: [(1.6, 10)], NEXT: [(5.49, 10)]},
        )

    assert _row(checks(7), name).verdict == "FAIL"  # (the next burst's argument)
    assert _row(checks(3), name).verdict == "ok"


def test_a_call_answered_with_a_task_id_after_its_last_claim_fails() -> None:
    name = "debounced: calls answered with a task id after its last claim"

    def checks(gap: float) -> Checks:
        # The third call at 1.0 + 2 * gap; the claim at 1.6 s took what was there.
        return _debounced(
            _burst(1, 2, 3, gap=gap), ran={BURST: [(1.61, 3, 10)]}, prerun={BURST: [(1.6, 10)]}
        )

    bad = _row(checks(0.4), name)
    assert (bad.verdict, bad.count) == ("FAIL", 1)
    assert "call of 3 at 1.80s" in bad.details[0]
    assert _row(checks(0.2), name).verdict == "ok"
    # After the delivery's prerun (1.6 s), before its body (1.61 s): the claim comes between
    # them, and the call may have reached Redis before it (seen on RabbitMQ).
    assert _row(checks(0.3025), name).verdict == "ok"


def test_a_debounced_task_id_that_never_ran_fails_but_for_kombu_or_celery() -> None:
    name = "debounced: calls whose task id never ran"
    never = _debounced(_burst(1, 2), ran={}, prerun={})
    assert (_row(never, name).verdict, _row(never, name).count) == ("FAIL", 1)
    ran = _debounced(_burst(1, 2), ran={BURST: [(1.5, 2, 10)]}, prerun={BURST: [(1.49, 10)]})
    assert _row(ran, name).verdict == "ok"
    cut = Fault("broker cut", 2.0, 5.0, "redis down 3s", frozenset({BURST}))
    lost = _debounced(_burst(1, 2), ran={}, prerun={}, faults=[cut])
    assert _row(lost, name).verdict == "ok"
    kombu = "debounced: kombu lost the message (popped before it was unacked)"
    assert _row(lost, kombu).verdict == "not ours"
    freed = _debounced(_burst(1, 2), ran={}, prerun={BURST: [(1.3, 10)]}, freed={BURST: [(1.4, 5)]})
    assert _row(freed, name).verdict == "ok"
    celery = "debounced: Celery acked as failed, its child killed before the run (key freed)"
    assert _row(freed, celery).verdict == "not ours"


def test_latest_arguments_left_for_a_task_id_that_ran_fail() -> None:
    name = "debounced: latest arguments left after the drain"
    left = [f"p:{{t.debounced:ab}}:latest ttl 3599s latest arguments of {BURST}"]

    def checks(ran: bool) -> Checks:
        return _debounced(
            _burst(1, 2),
            ran={BURST: [(1.5, 2, 10)]} if ran else {},
            prerun={BURST: [(1.49, 10)]} if ran else {},
            keys_left=left,
        )

    assert _row(checks(ran=True), name).verdict == "FAIL"
    # Of a task id that never ran (judged by the rows of calls that never ran): shown.
    assert _row(checks(ran=False), name).verdict == "info"
    assert _row(_debounced(_burst(1), ran={}, prerun={}), name).verdict == "ok"
    # Not a record: the keys-left row leaves it to this one.
    assert checks(ran=True).keys_left_rows()[0].verdict == "ok"
    # The hash's last take (take_latest.lua keeps it to answer it again): shown.
    taken = [f"p:{{t.debounced:ab}}:latest ttl 3599s latest arguments of {BURST} (taken)"]
    kept = _debounced(
        _burst(1, 2), ran={BURST: [(1.5, 2, 10)]}, prerun={BURST: [(1.49, 10)]}, keys_left=taken
    )
    assert _row(kept, name).verdict == "info"
    assert kept.keys_left_rows()[0].verdict == "ok"


def test_a_take_the_dedup_redis_could_not_answer_leaves_the_message_s_by_design() -> None:
    # Between the claim's prerun and the body, the take raised: the run has its message's.
    checks = _debounced(
        _burst(1, 2, 3),
        ran={BURST: [(1.61, 1, 10)]},
        prerun={BURST: [(1.6, 10)]},
        unavailable={BURST: [(1.605, 10, "runs with its message's arguments")]},
    )
    assert _row(checks, STALE).verdict == "ok"
    assert "could not be asked" in _row(checks, BY_DESIGN).details[0]


# -- the limited tasks ----------------------------------------------------------------------

A, B, C, D = "a0000000-a", "b0000000-b", "c0000000-c", "d0000000-d"


def _limited(
    task: str, runs: list[tuple[str, float, float | None]], **found: Any
) -> tuple[Checks, dict[str, Any]]:
    """Runs of ``task``'s key 1 (each a call of its own, made at 0.5 s; every run's prerun
    10 ms before its body, in pid 10), and the rows of the limited tasks by name."""
    calls = [
        Call(task, 1, task_id, False, 0.5, 0.5) for task_id in dict.fromkeys(r[0] for r in runs)
    ]
    checks = _judged(
        calls,
        runs={(task, 1): runs},
        completed={task_id: [end] for task_id, _, end in runs if end is not None},
        prerun={task_id: [(start - 0.01, 10)] for task_id, start, _ in runs},
        run_pids={(task_id, start): 10 for task_id, start, _ in runs},
        **found,
    )
    return checks, {row.check: row for row in checks.limit_rows()}


OVER = "limited: more than 2 runs of one key at once"


def test_three_runs_of_a_limited_key_at_once_fail_and_two_pass() -> None:
    _, bad = _limited(LIMITED, [(A, 1.0, 2.0), (B, 1.1, 2.0), (C, 1.5, 1.8)])
    assert (bad[OVER].verdict, bad[OVER].count) == ("FAIL", 1)
    assert C in bad[OVER].details[0]
    _, good = _limited(LIMITED, [(A, 1.0, 2.0), (B, 1.1, 2.0), (C, 2.0, 2.4)])
    assert good[OVER].verdict == "ok"


def test_a_third_run_just_after_a_dedup_restart_beside_an_older_one_is_shown_not_failed() -> None:
    restart = Fault("dedup restart", 1.2, 1.25, "data lost")
    runs = [(A, 1.0, 2.0), (B, 1.3, 2.0), (C, 1.5, 1.8)]
    _, rows = _limited(LIMITED, runs, faults=[restart])
    assert rows[OVER].verdict == "ok"
    assert rows["limited: up to 4 at once across a dedup restart (slots lost)"].count == 1
    # All three began after the restart: the slots were counted from then on.
    _, rows = _limited(LIMITED, [(A, 1.3, 2.0), (B, 1.4, 2.0), (C, 1.5, 1.8)], faults=[restart])
    assert rows[OVER].verdict == "FAIL"


def test_a_slot_whose_prerun_preceded_a_dedup_restart_counts_as_lost_with_it() -> None:
    # The body at 1.205 s began after the restart (1.2 s), its prerun (1.195 s) before it.
    restart = Fault("dedup restart", 1.2, 1.25, "data lost")
    _, rows = _limited(LIMITED, [(A, 1.205, 2.0), (B, 1.3, 2.0), (C, 1.4, 1.8)], faults=[restart])
    assert rows[OVER].verdict == "ok"
    assert rows["limited: up to 4 at once across a dedup restart (slots lost)"].count == 1


def test_a_run_that_could_not_ask_for_its_slot_is_not_counted() -> None:
    runs = [(A, 1.0, 2.0), (B, 1.1, 2.0), (C, 1.5, 1.8)]
    unavailable = {C: [(1.49, 10, "runs without its limit")]}
    _, rows = _limited(LIMITED, runs, unavailable=unavailable)
    assert rows[OVER].verdict == "ok"


RATE_ROW = "rated: more than 3 starts of one key in 1s"


def test_four_starts_of_a_rated_key_within_a_period_fail_and_a_period_apart_pass() -> None:
    def rows(fourth: float) -> dict[str, Any]:
        runs = [(A, 1.0, 1.1), (B, 1.3, 1.4), (C, 1.6, 1.7), (D, fourth, fourth + 0.1)]
        return _limited(RATED, runs)[1]

    bad = rows(1.9)[RATE_ROW]
    assert (bad.verdict, bad.count) == ("FAIL", 1)
    # A start is made between its prerun (10 ms before the body) and its body: 1.995 s is a
    # period after the first prerun (0.99 s), so it may be in time.
    assert rows(1.995)[RATE_ROW].verdict == "ok"
    assert rows(2.2)[RATE_ROW].verdict == "ok"


def test_starts_across_a_dedup_restart_may_reach_twice_the_rate() -> None:
    restart = Fault("dedup restart", 1.2, 1.25, "data lost")
    runs = [(A, 1.0, 1.1), (B, 1.1, 1.2), (C, 1.3, 1.4), (D, 1.4, 1.5)]
    _, rows = _limited(RATED, runs, faults=[restart])
    assert rows[RATE_ROW].verdict == "ok"
    assert rows["rated: up to 6 in 1s across a dedup restart (starts lost)"].count == 1


def test_a_start_whose_prerun_preceded_a_dedup_restart_counts_as_lost_with_it() -> None:
    # The body at 1.205 s began after the restart (1.2 s), its prerun (1.195 s) before it.
    restart = Fault("dedup restart", 1.2, 1.25, "data lost")
    runs = [(A, 1.205, 1.3), (B, 1.3, 1.4), (C, 1.35, 1.45), (D, 1.4, 1.5)]
    _, rows = _limited(RATED, runs, faults=[restart])
    assert rows[RATE_ROW].verdict == "ok"
    assert rows["rated: up to 6 in 1s across a dedup restart (starts lost)"].count == 1
    # All four preruns after the restart: the starts were counted from then on.
    later = [(A, 1.3, 1.4), (B, 1.35, 1.45), (C, 1.4, 1.5), (D, 1.45, 1.55)]
    assert _limited(RATED, later, faults=[restart])[1][RATE_ROW].verdict == "FAIL"


NEVER = "limited / rated / paced: calls that never ran"
ACKED = "limited / rated / paced: Celery acked as failed, its child killed before the run"
KOMBU = "limited / rated / paced: kombu lost the message (popped before it was unacked)"


def test_a_limited_call_that_never_ran_fails_but_for_kombu_or_celery() -> None:
    calls = [Call(LIMITED, 1, A, False, 1.0, 1.0)]
    never = _judged(calls)
    rows = {row.check: row for row in never.limit_rows()}
    assert rows[NEVER].verdict == "FAIL"
    lost = _judged(calls, worker_lost={A: [(1.5, 5)]}, prerun={A: [(1.4, 10)]})
    rows = {row.check: row for row in lost.limit_rows()}
    assert rows[NEVER].verdict == "ok"
    assert rows[ACKED].count
    _, ran = _limited(LIMITED, [(A, 1.0, 1.2)])
    assert ran[NEVER].verdict == "ok"
    # Its delivery failed (the message sent again to wait could not be published at a
    # broker cut): ours, and the line says so.
    cut = Fault("broker cut", 1.3, 4.0, "redis down 3s")
    failed = _judged(calls, faults=[cut], failed={A: [(1.5, 10, "OperationalError")]})
    row = {row.check: row for row in failed.limit_rows()}[NEVER]
    assert row.verdict == "FAIL"
    assert "failed with OperationalError at 1.50s (after broker cut" in row.details[0]


STUCK = "limited / rated / paced: places or slots stuck after the drain"


def test_a_place_or_a_live_slot_left_after_the_drain_is_stuck_but_not_a_killed_runs() -> None:
    line = f"p:{{t.limited:ab}}:line ttl 3600s member {A} ticket 4"
    slot = f"p:{{t.limited:ab}}:slots ttl 9s member {A} tok lease ends in 8.00s"
    over = f"p:{{t.limited:ab}}:slots ttl 9s member {A} tok lease over"
    _, rows = _limited(LIMITED, [(A, 1.0, 1.2)], keys_left=[line])
    assert rows[STUCK].verdict == "FAIL"
    _, rows = _limited(LIMITED, [(A, 1.0, 1.2)], keys_left=[slot])
    assert rows[STUCK].verdict == "FAIL"
    # Killed at 1.1 s (its end is its kill): the lease frees its slot.
    checks, rows = _limited(LIMITED, [(A, 1.0, 1.1)], keys_left=[slot, over])
    checks.e.completed.clear()
    assert {row.check: row for row in checks.limit_rows()}[STUCK].verdict == "ok"
    _, rows = _limited(LIMITED, [(A, 1.0, 1.2)], keys_left=[over])
    assert rows[STUCK].verdict == "ok"
    # A place of a message kombu lost lapses (documented): not stuck by our doing.
    cut = Fault("broker cut", 2.0, 5.0, "redis down 3s", frozenset({B}))
    lost = _judged(
        [Call(LIMITED, 1, B, False, 1.0, 1.0)],
        faults=[cut],
        keys_left=[f"p:{{t.limited:ab}}:line ttl 3600s member {B} ticket 5"],
    )
    assert {row.check: row for row in lost.limit_rows()}[STUCK].verdict == "ok"
    # (Not a record: the dedup tasks' row leaves them.)
    assert lost.keys_left_rows()[0].verdict == "ok"


def test_a_limited_message_sent_again_and_lost_by_kombu_is_kombus_but_not_once_delivered() -> None:
    # Delivered at 1 s and sent again to wait its turn; the message sent again was in the
    # queue before the broker cut at 2 s and in neither the queue nor the unacked hash after.
    cut = Fault("broker cut", 2.0, 5.0, "redis down 3s", frozenset({A}))
    calls = [Call(LIMITED, 1, A, False, 0.5, 0.5)]

    def rows(preruns: list[tuple[float, int]]) -> dict[str, Any]:
        checks = _judged(calls, faults=[cut], prerun={A: preruns}, retried={A: [(1.01, 10)]})
        return {row.check: row for row in checks.limit_rows()}

    lost = rows([(1.0, 10)])
    assert lost[NEVER].verdict == "ok"
    assert lost[KOMBU].count
    # A delivery after the cut: the message was not lost there; what became of it is ours.
    assert rows([(1.0, 10), (6.0, 11)])[NEVER].verdict == "FAIL"


# -- the paced task: both limits (key_concurrency=1, key_rate_limit="3/s") ------------------

PACED_OVER = "paced: more than 1 run of one key at once"
PACED_RATE_ROW = "paced: more than 3 starts of one key in 1s"


def test_two_runs_of_a_paced_key_at_once_fail_and_one_after_the_other_pass() -> None:
    overlapping = [(A, 1.0, 1.5), (B, 1.2, 1.6)]
    _, bad = _limited(PACED, overlapping)
    assert (bad[PACED_OVER].verdict, bad[PACED_OVER].count) == ("FAIL", 1)
    assert B in bad[PACED_OVER].details[0]
    assert bad[PACED_RATE_ROW].verdict == "ok"
    _, good = _limited(PACED, [(A, 1.0, 1.5), (B, 1.5, 1.7)])
    assert good[PACED_OVER].verdict == "ok"
    # Each task is judged by its own limit: two at once are within the limited task's.
    _, limited = _limited(LIMITED, overlapping)
    assert limited[OVER].verdict == "ok"
    assert limited[PACED_OVER].count == 0


def test_a_second_paced_run_just_after_a_dedup_restart_beside_an_older_one_is_shown() -> None:
    restart = Fault("dedup restart", 1.2, 1.25, "data lost")
    _, rows = _limited(PACED, [(A, 1.0, 2.0), (B, 1.3, 1.8)], faults=[restart])
    assert rows[PACED_OVER].verdict == "ok"
    assert rows["paced: up to 2 at once across a dedup restart (slots lost)"].count == 1
    # Three: beyond twice the limit, restart or not.
    runs = [(A, 1.0, 2.0), (B, 1.3, 2.0), (C, 1.4, 1.8)]
    _, rows = _limited(PACED, runs, faults=[restart])
    assert rows[PACED_OVER].verdict == "FAIL"
    # Both began after the restart: the slot was counted from then on.
    _, rows = _limited(PACED, [(A, 1.3, 2.0), (B, 1.4, 1.8)], faults=[restart])
    assert rows[PACED_OVER].verdict == "FAIL"


def test_four_starts_of_a_paced_key_within_a_period_fail_though_one_at_a_time() -> None:
    def rows(fourth: float, **found: Any) -> dict[str, Any]:
        runs = [(A, 1.0, 1.1), (B, 1.3, 1.4), (C, 1.6, 1.7), (D, fourth, fourth + 0.05)]
        return _limited(PACED, runs, **found)[1]

    bad = rows(1.9)
    assert (bad[PACED_RATE_ROW].verdict, bad[PACED_RATE_ROW].count) == ("FAIL", 1)
    assert bad[PACED_OVER].verdict == "ok"
    assert bad[RATE_ROW].count == 0  # (the rated task's row judges the rated task only)
    assert rows(1.995)[PACED_RATE_ROW].verdict == "ok"
    assert rows(2.2)[PACED_RATE_ROW].verdict == "ok"
    # Across a dedup restart, up to twice the rate: shown, not failed.
    restart = Fault("dedup restart", 1.2, 1.25, "data lost")
    across = rows(1.9, faults=[restart])
    assert across[PACED_RATE_ROW].verdict == "ok"
    assert across["paced: up to 6 in 1s across a dedup restart (starts lost)"].count == 1


def test_a_paced_call_that_never_ran_or_a_place_left_after_the_drain_fails() -> None:
    calls = [Call(PACED, 1, A, False, 1.0, 1.0)]
    assert {row.check: row for row in _judged(calls).limit_rows()}[NEVER].verdict == "FAIL"
    line = f"p:{{t.paced:ab}}:line ttl 3600s member {A} ticket 4"
    slot = f"p:{{t.paced:ab}}:slots ttl 9s member {A} tok lease ends in 8.00s"
    _, ran = _limited(PACED, [(A, 1.0, 1.2)])
    assert (ran[NEVER].verdict, ran[STUCK].verdict) == ("ok", "ok")
    _, rows = _limited(PACED, [(A, 1.0, 1.2)], keys_left=[line])
    assert rows[STUCK].verdict == "FAIL"
    _, rows = _limited(PACED, [(A, 1.0, 1.2)], keys_left=[slot])
    assert rows[STUCK].verdict == "FAIL"
    # Killed at 1.1 s: the lease frees its slot; its start, reserved or made, is forgotten.
    plan = f"p:{{t.paced:ab}}:plan ttl 2s member {A} at -0.50s"
    checks, _ = _limited(PACED, [(A, 1.0, 1.1)], keys_left=[slot, plan])
    checks.e.completed.clear()
    assert {row.check: row for row in checks.limit_rows()}[STUCK].verdict == "ok"


def test_a_call_answered_with_a_run_restored_across_a_dedup_restart_is_shown_not_failed() -> None:
    # The run (1.61-1.9 s) ran across the restart at 1.7 s; its message's record came back
    # in the call key, and a call at 1.8 s was answered with it.
    name = "debounced: calls answered with a task id after its last claim"
    restart = Fault("dedup restart", 1.7, 1.72, "data lost")
    calls = _burst(1, 2, 3, gap=0.4)
    checks = _debounced(calls, ran={BURST: [(1.61, 2, 10)]}, prerun={BURST: [(1.6, 10)]})
    checks.e.runs[("debounced", 3)] = [(BURST, 1.61, 1.9)]
    checks.spans[BURST] = [(1.61, 1.9)]
    assert _row(checks, name).verdict == "FAIL"
    checks.e.faults.append(restart)
    assert _row(checks, name).verdict == "ok"
    restored = "debounced: calls answered with a running task id restored after a restart"
    assert _row(checks, restored).count == 1


def test_a_key_whose_last_call_s_argument_never_ran_fails() -> None:
    name = "debounced: keys whose last call's argument never ran"

    def checks(last_ran: int) -> Checks:
        # Two bursts of key 3: (1, 2) ran with 2, then (3, 4) ran with ``last_ran``.
        calls = _burst(1, 2) + _burst(3, 4, at=5.0, task_id=NEXT)
        return _debounced(
            calls,
            ran={BURST: [(1.5, 2, 10)], NEXT: [(5.5, last_ran, 10)]},
            prerun={BURST: [(1.49, 10)], NEXT: [(5.49, 10)]},
        )

    bad = _row(checks(3), name)
    assert (bad.verdict, bad.count) == ("FAIL", 1)
    assert "last call of 4" in bad.details[0]
    assert _row(checks(4), name).verdict == "ok"


def test_a_key_left_with_no_ttl_fails() -> None:
    left = f"p:{{t.debounced:ab}}:latest ttl none latest arguments of {BURST} (taken)"
    assert _judged([], keys_left=[left]).no_ttl_row().verdict == "FAIL"
    kept = f"p:{{t.debounced:ab}}:latest ttl 3599s latest arguments of {BURST} (taken)"
    assert _judged([], keys_left=[kept]).no_ttl_row().verdict == "ok"
