"""A message's argsrepr and kwargsrepr, made cheaply, are what Celery's saferepr makes."""

from __future__ import annotations

from typing import Any

import pytest
from celery.utils.saferepr import saferepr
from hypothesis import given
from hypothesis import strategies as st

from dedupe.producer.message_repr import plain_repr

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=80),
    st.floats(),
    st.binary(max_size=8),
)
arguments = st.one_of(
    st.tuples(scalars),
    st.lists(scalars, max_size=6).map(tuple),
    st.lists(scalars, max_size=6),
    st.dictionaries(st.text(max_size=12), scalars, max_size=5),
    st.lists(st.lists(st.integers(), max_size=2), max_size=3),
)


@given(arguments, st.sampled_from([16, 64, 1024]), st.sampled_from([None, 0, 1, 3]))
def test_a_plain_repr_is_what_saferepr_makes(value: Any, maxsize: int, maxlevels: Any) -> None:
    made = plain_repr(value, maxsize=maxsize, maxlevels=maxlevels)
    if made is not None:
        levels = {} if maxlevels is None else {"maxlevels": maxlevels}
        assert made == saferepr(value, maxsize, **levels)


@pytest.mark.parametrize(
    "value",
    [("it's",), ("a\\b",), ("é",), (1.5,), ((1,),), ("x" * 65,), (b"a",), {1: 2}, "abc"],
)
def test_what_needs_saferepr_is_left_to_it(value: Any) -> None:
    assert plain_repr(value, maxsize=1024, maxlevels=3) is None


def test_the_common_calls_are_made_cheaply() -> None:
    assert plain_repr((42,), maxsize=1024, maxlevels=3) == "(42,)"
    assert plain_repr({}, maxsize=1024, maxlevels=3) == "{}"
    assert plain_repr({"report": "daily"}, maxsize=1024, maxlevels=None) == "{'report': 'daily'}"
