"""The chaos run (a correctness test of the whole layer under faults): ``python -m tests.chaos``
or ``./noxw -s chaos``; its short form runs in the test suite (tests/test_chaos.py)."""
