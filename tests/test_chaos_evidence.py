"""The chaos run's judgement (benchmarks/chaos_evidence.py), on evidence written by hand: when
an accepted ``unique_until="started"`` call stops holding its key."""

from __future__ import annotations

from benchmarks.chaos_evidence import Call, Checks, Evidence

HOLDER, LATER = "aaaaaaaa-holder", "bbbbbbbb-later"


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
    evidence = Evidence(
        calls=calls,
        runs={("started", 1): [(HOLDER, start, end) for start, end in runs]},
        completed={HOLDER: [end for _, end in runs]},
        overlaps={},
        prerun={HOLDER: prerun},
        faults=[],
        keys_left=[],
        t0=0.0,
        deferred={HOLDER: deferred},
    )
    return Checks(evidence, restart_window=20.0, broker="redis")


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
