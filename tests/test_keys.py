"""Key derivation: signature binding, canonical encoding, digests, key names (pure, no Redis)."""

from __future__ import annotations

import datetime as dt
import inspect
import sys
import uuid
from collections import OrderedDict
from decimal import Decimal
from enum import IntEnum
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from dedupe import KeyDerivationError
from dedupe.runs.inventory import task_of_key
from dedupe.values.canonical import canonical_bytes
from dedupe.values.key_derivation import Binder, KeyInputs, binder_for, call_digest, keys_for
from dedupe.values.keys import FLOW_SUFFIXES, CallKeyParts, CallKeys, call_keys, parse_call_key
from dedupe.values.limits import limit_keys
from dedupe.values.options import SEPARATE_RUN_LOCK, UniqueOptions


def sync_customer(customer_id: int, full: bool = False, *, region: str = "eu") -> None: ...


def variadic(a: Any, *rest: Any, **extra: Any) -> None: ...


BINDER = Binder("proj.sync_customer", inspect.signature(sync_customer))


def digest(*args: Any, **kwargs: Any) -> str:
    return call_digest("proj.sync_customer", BINDER, args, kwargs)


# -- binding to the signature ----------------------------------------------------------------


def test_positional_and_keyword_spellings_of_a_call_share_a_digest() -> None:
    assert digest(1) == digest(customer_id=1)


def test_passing_a_default_explicitly_is_the_same_call() -> None:
    assert digest(1) == digest(1, False) == digest(1, full=False) == digest(1, region="eu")


def test_a_non_default_value_is_a_different_call() -> None:
    assert digest(1) != digest(1, full=True)
    assert digest(1) != digest(2)


def test_arguments_that_do_not_fit_the_signature_raise_naming_the_task() -> None:
    with pytest.raises(KeyDerivationError, match=r"proj\.sync_customer") as caught:
        digest(1, nonsense=3)
    assert caught.value.argument is None
    assert "customer_id, full=False" in str(caught.value)


def test_variadic_arguments_are_bound_too() -> None:
    binder = Binder("t", inspect.signature(variadic))
    assert call_digest("t", binder, (1, 2), {"x": 1}) == call_digest("t", binder, [1, 2], {"x": 1})
    assert call_digest("t", binder, (1, 2), {}) != call_digest("t", binder, (1,), {"rest": 2})


# -- unique_on and unique_key ------------------------------------------------------------------


def test_unique_on_keeps_only_the_named_arguments() -> None:
    one = call_digest(
        "proj.sync_customer", BINDER, (1,), {"full": True}, unique_on=("customer_id",)
    )
    two = call_digest(
        "proj.sync_customer", BINDER, (1,), {"full": False}, unique_on=("customer_id",)
    )
    assert one == two
    assert one != call_digest("proj.sync_customer", BINDER, (2,), {}, unique_on=("customer_id",))


def test_unique_on_with_an_unknown_name_raises_naming_it_and_the_signature() -> None:
    with pytest.raises(KeyDerivationError) as caught:
        call_digest("proj.sync_customer", BINDER, (1,), {}, unique_on=("customer",))
    assert caught.value.argument == "customer"
    assert "proj.sync_customer(customer_id, full=False, *, region='eu')" in str(caught.value)


def test_unique_on_for_an_unregistered_task_matches_keyword_arguments() -> None:
    assert call_digest("remote", None, (), {"a": 1, "b": 2}, unique_on=("a",)) == call_digest(
        "remote", None, (), {"a": 1, "b": 3}, unique_on=("a",)
    )


def test_unique_on_for_an_unregistered_task_cannot_name_positional_arguments() -> None:
    with pytest.raises(KeyDerivationError, match="keyword argument"):
        call_digest("remote", None, (1,), {}, unique_on=("a",))


def test_unique_key_decides_the_digest() -> None:
    def by_customer(customer_id: int, **_: Any) -> int:
        return customer_id

    one = call_digest("t", BINDER, (7,), {"full": True}, unique_key=by_customer)
    assert one == call_digest("t", BINDER, (7,), {}, unique_key=by_customer)
    assert one != call_digest("t", BINDER, (8,), {}, unique_key=by_customer)


def test_unique_key_that_raises_is_reported_with_the_task() -> None:
    def broken(*_: Any) -> None:
        raise LookupError("nope")

    with pytest.raises(KeyDerivationError, match=r"'t'.*unique_key .*broken raised LookupError"):
        call_digest("t", None, (1,), {}, unique_key=broken)


def test_unregistered_task_keys_on_arguments_as_passed() -> None:
    assert call_digest("remote", None, (1,), {}) == call_digest("remote", None, [1], None)
    assert call_digest("remote", None, (1,), {}) != call_digest("remote", None, (), {"x": 1})


# -- canonical encoding ------------------------------------------------------------------------


def test_tuples_and_lists_are_alike_at_any_depth() -> None:
    assert digest({"a": (1, (2, 3))}) == digest({"a": [1, [2, 3]]})


def test_dict_key_order_does_not_matter() -> None:
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
    assert digest({1: "x", "1": "y"}) == digest({"1": "y", 1: "x"})


@pytest.mark.parametrize(
    "values",
    [
        (1, 1.0, True, "1", b"1", Decimal("1"), [1], None),
        (0, 0.0, False, "", b"", None, [], {}),
        (dt.date(2026, 11, 22), "2026-11-22", dt.datetime(2026, 11, 22)),
        (dt.time(12, 0), "12:00:00"),
        (uuid.UUID(int=7), uuid.UUID(int=7).hex, str(uuid.UUID(int=7))),
        (Decimal("1.0"), Decimal("1.00"), 1.0, "1.0"),
        (2**64, str(2**64), float(2**64)),
        (frozenset({1}), [1], {1: None}),
    ],
)
def test_values_of_different_types_never_collide(values: tuple[Any, ...]) -> None:
    digests = [digest(value) for value in values]
    assert len(set(digests)) == len(values)


def test_aware_datetimes_in_different_zones_stay_distinct_as_sent() -> None:
    utc = dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc)
    cet = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert digest(utc) != digest(cet)


def test_subclasses_encode_like_their_json_base_type() -> None:
    class Level(IntEnum):
        HIGH = 3

    assert digest(Level.HIGH) == digest(3)
    assert digest(OrderedDict([("b", 1), ("a", 2)])) == digest({"a": 2, "b": 1})


def test_sets_are_order_insensitive() -> None:
    assert digest({3, 1, 2}) == digest({1, 2, 3}) == digest(frozenset({2, 3, 1}))


def test_an_unencodable_argument_raises_naming_the_task_and_its_path() -> None:
    with pytest.raises(KeyDerivationError) as caught:
        digest({"items": [1, object()]})
    error = caught.value
    assert error.task_name == "proj.sync_customer"
    assert error.argument == "customer_id['items'][1]"
    assert "builtins.object" in str(error)
    assert "unique_on" in str(error)


def test_an_unencodable_top_level_argument_is_named_plainly() -> None:
    with pytest.raises(KeyDerivationError) as caught:
        digest(1, full=object())
    assert caught.value.argument == "full"


def test_a_lone_surrogate_raises_naming_the_argument_and_where_in_the_text() -> None:
    with pytest.raises(KeyDerivationError) as caught:
        digest({"names": ["ok", "bad \udc80 name"]})
    error = caught.value
    assert error.argument == "customer_id['names'][1]"
    assert "'\\udc80' at index 4" in str(error)
    assert "lone surrogate" in str(error)


def test_a_lone_surrogate_in_a_dict_key_names_the_key() -> None:
    with pytest.raises(KeyDerivationError) as caught:
        digest({"\ud800": 1})
    assert caught.value.argument == "customer_id key '\\ud800'"


def test_a_lone_surrogate_in_a_set_member_names_the_member() -> None:
    with pytest.raises(KeyDerivationError) as caught:
        digest(1, region=frozenset({"\ud800"}))
    assert caught.value.argument == "region member '\\ud800'"


def test_a_value_that_contains_itself_raises_naming_the_argument() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(KeyDerivationError) as caught:
        digest(1, region=loop)
    assert caught.value.argument == "region"
    assert "contains itself" in str(caught.value)


def test_a_model_whose_dump_fails_raises_naming_the_argument() -> None:
    class Broken:
        def model_dump(self, mode: str) -> Any:
            raise RuntimeError("no json form")

    with pytest.raises(KeyDerivationError) as caught:
        digest(Broken())
    assert caught.value.argument == "customer_id"
    assert "no json form" in str(caught.value)


def test_an_int_of_more_than_4300_digits_has_a_key_of_its_own() -> None:
    huge = 10**4300
    as_bytes = huge.to_bytes(1786, "big", signed=True)
    assert len({digest(huge), digest(huge + 1), digest(-huge), digest(as_bytes)}) == 4
    assert digest(huge) == digest(10 * 10**4299)


def test_big_int_keys_do_not_depend_on_the_int_max_str_digits_setting() -> None:
    before = digest(10**1000)
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert digest(10**1000) == before
    finally:
        sys.set_int_max_str_digits(limit)


# -- key names ---------------------------------------------------------------------------------


def test_keys_carry_a_cluster_hash_tag_shared_by_the_run_lock() -> None:
    keys = call_keys("dedupe", "proj.sync", "ab" * 16, separate_run_lock=True)
    assert keys.call == "dedupe:{proj.sync:" + "ab" * 16 + "}"
    assert keys.run == keys.call + ":run"
    assert call_keys("dedupe", "t", "00", separate_run_lock=False).run == "dedupe:{t:00}"


@pytest.mark.parametrize("name", ["}x", "a}b", "{}", "}", "a{b", "x%7Dy", "%", "sync"])
def test_a_calls_keys_share_one_cluster_slot_whatever_the_task_name(name: str) -> None:
    keys = call_keys("dedupe", name, "ab" * 16, separate_run_lock=True)
    assert key_slot(keys.call.encode()) == key_slot(keys.run.encode())
    assert task_of_key("dedupe", keys.run) == name


def test_names_without_braces_or_percent_signs_keep_their_keys() -> None:
    keys = call_keys("dedupe", "proj.sync:eu{1}", "ab" * 16, separate_run_lock=False)
    assert keys.call == "dedupe:{proj.sync:eu{1%7D:" + "ab" * 16 + "}"
    assert call_keys("dedupe", "proj.sync", "00", separate_run_lock=False).call == (
        "dedupe:{proj.sync:00}"
    )


@given(st.text(st.sampled_from(["a", "}", "{", "%", "7", "D", "2", "5", ":"]), max_size=8))
def test_distinct_task_names_never_share_keys_and_read_back(name: str) -> None:
    keys = call_keys("dedupe", name, "ab" * 16, separate_run_lock=True)
    assert task_of_key("dedupe", keys.call) == name
    assert key_slot(keys.call.encode()) == key_slot(keys.run.encode())


@given(st.text(), st.text(), st.text("0123456789abcdef", min_size=32, max_size=32))
@example("dedupe", "reports:eu", "ab" * 16)
@example("dedupe", "a}b{c}:%7D%", "ab" * 16)
@example("app:{x}", "報告:タスク", "ab" * 16)
@example("", "", "ab" * 16)
def test_a_calls_key_and_run_lock_parse_back_to_its_task_name_and_digest(
    prefix: str, name: str, digest: str
) -> None:
    keys = call_keys(prefix, name, digest, separate_run_lock=True)
    assert parse_call_key(prefix, keys.call) == CallKeyParts(name, digest, run_lock=False)
    assert parse_call_key(prefix, keys.run) == CallKeyParts(name, digest, run_lock=True)


def test_every_key_of_flow_control_beside_a_record_has_a_flow_suffix() -> None:
    keys = call_keys("dedupe", "jobs", "ab" * 16, separate_run_lock=True)
    beside = [keys.latest, keys.ran, *limit_keys(keys.call).values()]
    assert all(key.endswith(FLOW_SUFFIXES) for key in beside)
    assert not keys.call.endswith(FLOW_SUFFIXES)
    assert not keys.run.endswith(FLOW_SUFFIXES)


def test_the_keys_of_flow_control_beside_a_record_parse_as_no_call_key() -> None:
    keys = call_keys("dedupe", "jobs", "ab" * 16, separate_run_lock=False)
    for key in [keys.latest, keys.ran, *limit_keys(keys.call).values()]:
        assert parse_call_key("dedupe", key) is None


def test_digest_is_128_bit_hex() -> None:
    value = digest(1)
    assert len(value) == 32
    int(value, 16)


# -- golden vectors: a change here changes every user's keys (bump KEY_VERSION) ------------------

GOLDEN: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
    ((1,), {}, "9a388db87b24b5b884756b19ccebc388"),
    ((1,), {"full": True}, "f50615b8d7b1e13e626217338fdb225d"),
    ((0,), {"region": "us"}, "28b6d12ce8abb4706bd3c558f3b28128"),
    (("abc",), {}, "078bb1c59b1c3139d1ce89c446e9b005"),
    ((1.5,), {}, "ffc82035e974afce300dc2227c2e2a01"),
    ((None,), {}, "4376efa9ce9aca8cdd2cd7a5e61fb013"),
    ((True,), {}, "ab53c15bb53e58d824a01438037cbaa1"),
    ((b"\x00\xff",), {}, "fda21f5633b8c3fdeb88b7209f270945"),
    (([1, "two", 3.0],), {}, "f956d391200011626619e34d54d46ede"),
    (({"b": [1, 2], "a": {"z": None}},), {}, "eb287473ecf5ffc4c85b2dd87559f218"),
    ((2**70,), {}, "2995bb46558f535af820a4542a254edd"),
    ((-(2**63),), {}, "1c2e10b950e8fe31aa2e9dd089e136d5"),
    (
        (dt.datetime(2026, 11, 22, 9, 30, tzinfo=dt.timezone.utc),),
        {},
        "052041a562952a84ddf5d3535021157f",
    ),
    ((dt.date(2026, 11, 22),), {}, "0dbe953fc0159337430247e22dd7d7c6"),
    ((dt.time(23, 59, 59, 1),), {}, "0a4b3b902641256837d1bf24b03a74bc"),
    ((uuid.UUID("12345678-1234-5678-1234-567812345678"),), {}, "5f15d951eedf058057a37ec98a63d9d4"),
    ((Decimal("10.50"),), {}, "d3a3703e16c0bea6dbfb39e15aa66632"),
    (({1: "int key", "1": "str key"},), {}, "8cfdd75641a4b70c8c00d450e54adb75"),
    ((frozenset({"x", "y"}),), {}, "31b8f2a1d1952be893b48f8ee1c14180"),
    (("ünïcødé ✓",), {"full": False, "region": "eu"}, "3cf4ad9c3f820cfaa68700a023567d76"),
    # The largest ints CPython's str() takes by default: their keys are those of every version.
    ((10**4299,), {}, "6073abb199fc34513369e2e276e2f315"),
    ((-(10**4300 - 1),), {}, "7c1d15a58bf818a1bcfd92a2fec5ed97"),
    # Beyond that str() refuses; these keys are new in this version.
    ((10**4300,), {}, "194fab7bc3fd7a5d96bb2d92f7c3f48d"),
    ((-(10**4300),), {}, "4539e6e623d7379f3a50c6cf9f278197"),
]


@pytest.mark.parametrize(("args", "kwargs", "expected"), GOLDEN)
def test_golden_digests_never_change(
    args: tuple[Any, ...], kwargs: dict[str, Any], expected: str
) -> None:
    assert digest(*args, **kwargs) == expected


# -- properties --------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.datetimes()
    | st.dates()
    | st.uuids()
    | st.decimals(allow_nan=False, places=3)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=4)
    ),
    max_leaves=12,
)


def same_value(a: Any, b: Any) -> bool:
    """Type-exact equality, tuples and lists alike, dicts order-free: what keys promise."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b):
            return False
        by_key = {(type(k), k): v for k, v in b.items()}
        return all(
            (type(k), k) in by_key and same_value(v, by_key[(type(k), k)]) for k, v in a.items()
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, dt.datetime):
        return a.isoformat() == b.isoformat()
    return bool(a == b) and not (isinstance(a, float) and str(a) != str(b))


def reshaped(value: Any) -> Any:
    """An equivalent value: tuples become lists and back, dict order reversed."""
    if isinstance(value, tuple):
        return [reshaped(item) for item in value]
    if isinstance(value, list):
        return tuple(reshaped(item) for item in value)
    if isinstance(value, dict):
        return {k: reshaped(v) for k, v in reversed(list(value.items()))}
    return value


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(values)
def test_equivalent_values_share_a_digest(value: Any) -> None:
    assert digest(value) == digest(reshaped(value))


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(values, values)
def test_different_values_never_share_a_digest(a: Any, b: Any) -> None:
    assert (canonical_bytes(a) == canonical_bytes(b)) == same_value(a, b)
    assert (digest(a) == digest(b)) == same_value(a, b)


@settings(max_examples=200, deadline=None)
@given(st.integers(), st.booleans())
def test_binding_makes_spelling_irrelevant(customer_id: int, full: bool) -> None:
    expected = digest(customer_id, full)
    assert digest(customer_id=customer_id, full=full) == expected
    assert digest(customer_id, full=full, region="eu") == expected


def test_a_namedtuple_is_encoded_as_the_tuple_json_would_send() -> None:
    from collections import namedtuple

    Point = namedtuple("Point", "x y")
    assert canonical_bytes(Point(1, 2)) == canonical_bytes((1, 2)) == canonical_bytes([1, 2])


@pytest.mark.slow
def test_set_digests_do_not_depend_on_the_hash_seed() -> None:
    import subprocess
    import sys

    script = (
        "from dedupe.values.canonical import canonical_bytes; "
        "print(canonical_bytes({'alpha', 'beta', 'gamma', 'delta', 'epsilon'}).hex())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(6)
    }
    assert len(outputs) == 1


def test_pydantic_models_of_different_classes_never_collide() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Customer(pydantic.BaseModel):
        id: int

    class Supplier(pydantic.BaseModel):
        id: int

    assert canonical_bytes(Customer(id=1)) == canonical_bytes(Customer(id=1))
    assert canonical_bytes(Customer(id=1)) != canonical_bytes(Supplier(id=1))
    assert canonical_bytes(Customer(id=1)) != canonical_bytes({"id": 1})


def test_an_unregistered_tasks_positional_and_keyword_arguments_stay_apart() -> None:
    assert call_digest("remote", None, (1,), {}) != call_digest("remote", None, (), {"args": [1]})
    assert call_digest("remote", None, (1,), {}) == "dd06c36e1b528da7fb1205d80696dd48"


def _sig_plain(a: Any, b: Any = 2, *, c: Any = 3) -> None: ...
def _sig_varargs(a: Any, *rest: Any, b: Any = 2, **extra: Any) -> None: ...
def _sig_posonly(a: Any, /, b: Any, c: Any = 3, **extra: Any) -> None: ...
def _sig_kwonly(*, a: Any, b: Any = 2) -> None: ...


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([_sig_plain, _sig_varargs, _sig_posonly, _sig_kwonly]),
    st.lists(st.integers(), max_size=4),
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "rest", "extra", "z"]), st.integers(), max_size=4
    ),
)
def test_the_fast_binder_binds_exactly_as_inspect_does(
    function: Any, args: list[int], kwargs: dict[str, int]
) -> None:
    signature = inspect.signature(function)
    binder = Binder("t", signature)
    try:
        expected = signature.bind(*args, **kwargs)
    except TypeError:
        with pytest.raises(KeyDerivationError):
            binder.bind(args, kwargs)
        return
    expected.apply_defaults()
    assert binder.bind(args, kwargs) == dict(expected.arguments)


def has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(char) <= 0xDFFF for char in value)
    if isinstance(value, dict):
        return any(has_lone_surrogate(k) or has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, (list, tuple, frozenset)):
        return any(has_lone_surrogate(item) for item in value)
    return False


texts = st.text(st.sampled_from(["a", "é", "✓", "\ud800", "\udfff", "\U0001f600"]), max_size=4)
anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([64, 70, 4299, 4300, 5000]).map(lambda digits: -(10**digits))
    | st.floats()
    | texts
    | st.binary(max_size=4)
    | st.datetimes()
    | st.frozensets(texts, max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(texts | st.integers(), inner, max_size=3)
    ),
    max_leaves=10,
)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(anything)
def test_a_value_has_a_key_unless_it_holds_a_lone_surrogate_and_then_names_where(
    value: Any,
) -> None:
    if has_lone_surrogate(value):
        with pytest.raises(KeyDerivationError, match="lone surrogate") as caught:
            digest(value)
        assert caught.value.argument is not None
        assert caught.value.argument.startswith("customer_id")
    else:
        assert len(digest(value)) == 32


# -- remembered keys: a duplicate looks its keys up -------------------------------------------


def task_object(function: Any, name: str = "proj.remembered") -> Any:
    """What keys_for needs of a Celery task: its name and its run function."""
    return SimpleNamespace(name=name, run=function)


def fresh_keys(task: Any, options: UniqueOptions, args: Any, prefix: str = "p") -> CallKeys:
    """The keys of a call derived from scratch, never looked up."""
    binder = Binder(task.name, inspect.signature(task.run))
    digest = call_digest(task.name, binder, args, None, unique_on=options.on)
    separate = options.until in SEPARATE_RUN_LOCK
    return call_keys(prefix, task.name, digest, separate_run_lock=separate)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(anything, max_size=3), min_size=1, max_size=6),
    st.sampled_from([UniqueOptions(), UniqueOptions(until="started"), UniqueOptions(on=("a",))]),
)
def test_a_call_made_again_gets_the_keys_a_fresh_derivation_gives(
    calls: list[list[Any]], options: UniqueOptions
) -> None:
    task = task_object(_sig_varargs)
    for args in calls + calls:  # each call twice: the second may be looked up
        try:
            expected = fresh_keys(task, options, args)
        except KeyDerivationError:
            with pytest.raises(KeyDerivationError):
                keys_for("p", task, task.name, options, args, None)
            continue
        assert keys_for("p", task, task.name, options, args, None) == expected


def test_ints_bools_floats_and_strs_of_one_value_keep_their_own_keys_when_remembered() -> None:
    task = task_object(_sig_varargs)
    calls = [(1,), (True,), (1.0,), ("1",), (0,), (False,), (0.0,), (-0.0,), ("0",)]
    for args in calls + calls:
        assert keys_for("p", task, task.name, UniqueOptions(), args, None) == fresh_keys(
            task, UniqueOptions(), args
        )
    assert len({keys_for("p", task, task.name, UniqueOptions(), a, None) for a in calls}) == 9


def test_a_task_whose_default_may_change_in_place_is_never_remembered() -> None:
    seen: list[int] = []

    def collecting(x: int, seen: list[int] = seen) -> None: ...

    task = task_object(collecting)
    before = keys_for("p", task, task.name, UniqueOptions(), (1,), None)
    seen.append(2)  # the default changed in place: so did the call's arguments
    after = keys_for("p", task, task.name, UniqueOptions(), (1,), None)
    assert after != before
    assert after == fresh_keys(task, UniqueOptions(), (1,))


def test_the_options_and_prefix_that_name_keys_are_part_of_what_is_remembered() -> None:
    task = task_object(_sig_varargs)
    for prefix, options in [
        ("p", UniqueOptions()),
        ("q", UniqueOptions()),
        ("p", UniqueOptions(until="started")),
        ("p", UniqueOptions(on=("a",))),
    ]:
        for _ in range(2):
            assert keys_for(prefix, task, task.name, options, (7,), None) == fresh_keys(
                task, options, (7,), prefix
            )


def test_a_task_remembers_a_bounded_number_of_calls() -> None:
    task = task_object(_sig_varargs)
    for n in range(3000):
        keys_for("p", task, task.name, UniqueOptions(), (n,), None)
    assert 0 < len(binder_for(task).remembered) <= 128


def test_large_arguments_are_never_remembered() -> None:
    task = task_object(_sig_varargs)
    for args in [("x" * 257,), (2**63,), (-(2**63) - 1,), ([1, 2],)]:
        keys_for("p", task, task.name, UniqueOptions(), args, None)
    assert binder_for(task).remembered == {}


#: For each input of a call's keys, two options that differ in that input alone.
KEY_INPUT_PAIRS: dict[str, tuple[UniqueOptions, UniqueOptions]] = {
    "on": (UniqueOptions(), UniqueOptions(on=("a",))),
    "key": (UniqueOptions(), UniqueOptions(key=lambda *args, **kwargs: "one for all")),
    "separate_run_lock": (UniqueOptions(), UniqueOptions(until="started")),
}


def test_each_input_of_a_calls_keys_has_options_that_differ_in_it_alone() -> None:
    assert set(KEY_INPUT_PAIRS) == set(KeyInputs._fields)
    for field, (one, other) in KEY_INPUT_PAIRS.items():
        one_inputs, other_inputs = KeyInputs.of(one), KeyInputs.of(other)
        differ = [
            n for n in KeyInputs._fields if getattr(one_inputs, n) != getattr(other_inputs, n)
        ]
        assert differ == [field]


@pytest.mark.parametrize("field", KeyInputs._fields)
def test_calls_that_differ_in_one_input_of_their_keys_get_different_keys_derived_and_remembered(
    field: str,
) -> None:
    task = task_object(_sig_plain)  # (unique_on=("a",) leaves b out of the digest)
    pair = KEY_INPUT_PAIRS[field]
    binder = Binder(task.name, inspect.signature(task.run))
    derived = [KeyInputs.of(options).derive("p", task.name, binder, (7,), None) for options in pair]
    assert derived[0] != derived[1]
    for _ in range(2):  # the second time, from what the binder remembers
        assert [keys_for("p", task, task.name, options, (7,), None) for options in pair] == derived
    assert len(binder_for(task).remembered) == sum(options.key is None for options in pair)


def test_a_remembered_call_is_filed_under_its_prefix_task_name_key_inputs_and_arguments() -> None:
    task = task_object(_sig_plain)
    options = UniqueOptions(on=("a",), until="started")
    keys_for("p", task, task.name, options, (7,), None)
    assert list(binder_for(task).remembered) == [("p", task.name, KeyInputs.of(options), (7,))]
