"""Reading keys back to their task: the exact inverse of how keys.call_keys names them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dedupe.runs.inventory import task_of_key
from dedupe.values.keys import call_keys

DIGEST = "0123456789abcdef0123456789abcdef"
names = st.text(min_size=1)
prefixes = st.text(min_size=1)


@given(prefixes, names)
def test_a_calls_keys_read_back_to_exactly_its_task_name(prefix: str, name: str) -> None:
    keys = call_keys(prefix, name, DIGEST, separate_run_lock=True)
    assert task_of_key(prefix, keys.call) == name
    assert task_of_key(prefix, keys.run) == name


@given(prefixes, names, names)
def test_a_key_of_another_task_never_reads_as_this_one(prefix: str, name: str, other: str) -> None:
    keys = call_keys(prefix, other, DIGEST, separate_run_lock=False)
    assert (task_of_key(prefix, keys.call) == name) == (name == other)


def test_a_key_of_another_prefix_or_program_reads_as_no_task() -> None:
    assert task_of_key("dedupe", f"other:{{jobs:{DIGEST}}}") is None
    assert task_of_key("dedupe", "dedupe:{jobs:1}") is None
    assert task_of_key("dedupe", f"dedupe:{{jobs:{DIGEST}") is None
