"""Settings: read from app.conf (or Celery's Django namespace), validated with clear errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

import dedupe
from dedupe.values.config import DedupeConfig


def bare_app(broker: str, **conf: Any) -> Celery:
    app = Celery("configured", broker=broker, set_as_current=False)
    app.conf.update(conf)
    return app


@pytest.mark.parametrize(
    ("broker", "expected"),
    [
        ("redis://cache:6379/2", "redis://cache:6379/2"),
        ("rediss://:secret@cache:6380/0", "rediss://:secret@cache:6380/0"),
        ("redis+socket:///run/redis.sock", "unix:///run/redis.sock"),
        ("amqp://guest@rabbit//;redis://cache:6379/0", "redis://cache:6379/0"),
    ],
)
def test_the_dedup_redis_defaults_to_a_redis_broker(broker: str, expected: str) -> None:
    assert DedupeConfig.from_app(bare_app(broker)).redis_url == expected


def test_a_broker_that_is_not_redis_needs_dedupe_redis_url_and_says_so() -> None:
    with pytest.raises(dedupe.ConfigurationError) as caught:
        DedupeConfig.from_app(bare_app("amqp://guest:secret@rabbit:5672//"))
    message = str(caught.value)
    assert "dedupe_redis_url" in message
    assert "configured" in message  # names the app
    assert "secret" not in message  # and never leaks the broker's password


def test_dedupe_redis_url_wins_over_the_broker() -> None:
    app = bare_app("amqp://rabbit//", dedupe_redis_url="redis://records:6379/3")
    assert DedupeConfig.from_app(app).redis_url == "redis://records:6379/3"


def test_settings_in_celerys_django_namespace_are_read() -> None:
    # namespace="CELERY" keeps settings Celery does not know upper-case.
    app = bare_app(
        "amqp://rabbit//",
        DEDUPE_REDIS_URL="redis://records:6379/4",
        DEDUPE_KEY_PREFIX="site",
        DEDUPE_DEFAULT_TTL=120,
    )
    config = DedupeConfig.from_app(app)
    assert (config.redis_url, config.key_prefix, config.default_ttl) == (
        "redis://records:6379/4",
        "site",
        120.0,
    )


def test_defaults() -> None:
    config = DedupeConfig.from_app(bare_app("redis://cache//"))
    assert (config.key_prefix, config.default_ttl, config.default_lease) == ("dedupe", 3600, 60)
    assert config.on_redis_error == "enqueue"
    assert config.busy_poll == 100e-6


@pytest.mark.parametrize(
    ("setting", "value", "hint"),
    [
        ("dedupe_on_redis_error", "ignore", "'enqueue'"),
        ("dedupe_key_prefix", "a{b}", "braces"),
        ("dedupe_key_prefix", "", "non-empty"),
        ("dedupe_default_ttl", 0, "positive"),
        ("dedupe_default_lease", "60", "positive"),
        ("dedupe_redis_options", ["socket_timeout", 1], "mapping"),
        ("dedupe_busy_poll_us", -1, "0 or more"),
        ("dedupe_busy_poll_us", "100", "microseconds"),
        ("dedupe_web_token", "short", "16 characters"),
        ("dedupe_web_basic_auth", "admin", "'user:password'"),
    ],
)
def test_a_bad_setting_is_a_configuration_error_naming_it(
    setting: str, value: Any, hint: str
) -> None:
    with pytest.raises(dedupe.ConfigurationError) as caught:
        DedupeConfig.from_app(bare_app("redis://cache//", **{setting: value}))
    assert setting in str(caught.value)
    assert hint in str(caught.value)


@pytest.mark.parametrize(
    ("setting", "hint"),
    [
        ("dedupe_redis_ulr", "did you mean dedupe_redis_url?"),
        ("DEDUPE_CALL_BUDGT", "did you mean DEDUPE_CALL_BUDGET?"),
        ("dedupe_anything", "its settings are dedupe_redis_url, "),
    ],
)
def test_a_setting_celery_dedupe_does_not_have_is_refused_naming_the_nearest_one(
    setting: str, hint: str
) -> None:
    with pytest.raises(dedupe.ConfigurationError) as caught:
        DedupeConfig.from_app(bare_app("redis://cache//", **{setting: 1}))
    assert str(caught.value).startswith(f"{setting} is not a setting of celery-dedupe; {hint}")


class _DjangoDedupeSettings:
    CELERY_BROKER_URL = "redis://cache//"
    CELERY_DEDUPE_DEFAULT_TTL = 120
    CELERY_DEDUPE_DEFAULT_TLL = 60


def test_a_misspelt_setting_in_celerys_django_namespace_is_refused() -> None:
    app = Celery("configured", set_as_current=False)
    app.config_from_object(_DjangoDedupeSettings, namespace="CELERY")
    with pytest.raises(dedupe.ConfigurationError) as caught:
        DedupeConfig.from_app(app)
    assert str(caught.value) == (
        "CELERY_DEDUPE_DEFAULT_TLL is not a setting of celery-dedupe; "
        "did you mean CELERY_DEDUPE_DEFAULT_TTL?"
    )


class _DjangoProjectSettings:
    CELERY_BROKER_URL = "redis://cache//"
    DEDUPE_MODE = "another library's setting"


def test_a_django_setting_outside_celerys_namespace_is_not_ours_to_judge() -> None:
    app = Celery("configured", set_as_current=False)
    app.config_from_object(_DjangoProjectSettings, namespace="CELERY")
    assert DedupeConfig.from_app(app).redis_url == "redis://cache//"


def test_a_misspelt_setting_refuses_an_installed_apps_first_call(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app(dedupe_default_ttll=60)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    with pytest.raises(dedupe.ConfigurationError, match=r"did you mean dedupe_default_ttl\?"):
        job.delay(1)


def test_the_web_views_credentials_are_read_from_the_settings() -> None:
    app = bare_app(
        "redis://cache//",
        dedupe_web_token="t" * 16,
        dedupe_web_basic_auth="admin:s3:cret",
    )
    config = DedupeConfig.from_app(app)
    assert (config.web_token, config.web_basic_auth) == ("t" * 16, ("admin", "s3:cret"))


def test_a_bad_basic_auth_setting_never_shows_the_password() -> None:
    with pytest.raises(dedupe.ConfigurationError) as caught:
        DedupeConfig.from_app(bare_app("redis://cache//", dedupe_web_basic_auth=":hunter2"))
    assert "hunter2" not in str(caught.value)


def test_decode_responses_in_the_redis_options_is_refused_naming_it() -> None:
    app = bare_app("redis://cache//", dedupe_redis_options={"decode_responses": True})
    with pytest.raises(dedupe.ConfigurationError, match="decode_responses=True in dedupe_redis"):
        DedupeConfig.from_app(app)


def test_decode_responses_in_the_redis_url_is_refused_naming_it() -> None:
    app = bare_app("redis://cache//", dedupe_redis_url="redis://cache/0?decode_responses=True")
    with pytest.raises(dedupe.ConfigurationError, match="decode_responses=True in the Redis URL"):
        DedupeConfig.from_app(app)


def test_decode_responses_off_is_accepted() -> None:
    app = bare_app(
        "redis://cache//?decode_responses=false", dedupe_redis_options={"decode_responses": False}
    )
    assert DedupeConfig.from_app(app).redis_options == {"decode_responses": False}


def test_dedupe_busy_poll_us_zero_turns_polling_off() -> None:
    config = DedupeConfig.from_app(bare_app("redis://cache//", dedupe_busy_poll_us=0))
    assert config.busy_poll == 0


def test_the_store_polls_as_long_as_dedupe_busy_poll_us_says(
    make_app: Callable[..., Celery],
) -> None:
    from dedupe.runs.runtime import runtime_of

    app = make_app(dedupe_busy_poll_us=0)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    assert not job.delay(1).deduplicated
    assert job.delay(1).deduplicated
    assert runtime_of(app).store._run._busy_poll == 0


def test_dedupe_default_ttl_sets_the_life_of_a_queued_record(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app(dedupe_default_ttl=90)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    job.delay(1)
    holder = dedupe.lookup(job, (1,))
    assert holder is not None
    assert holder.ttl is not None
    assert 85 < holder.ttl <= 90


def test_using_an_app_that_was_never_installed_says_how_to_fix_it() -> None:
    app = bare_app("redis://cache//")

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    with pytest.raises(dedupe.NotInstalled, match=r"dedupe\.install\(app\)"):
        job.delay(1)


def test_options_declared_on_the_task_apply_to_every_call(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()

    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        unique=True,
        unique_on=("customer_id",),
        unique_ttl=45,
        on_duplicate="raise",
    )
    def sync(customer_id: int, full: bool = False) -> None: ...

    first = sync.delay(5, full=True)
    with pytest.raises(dedupe.AlreadyQueued) as caught:
        sync.delay(5, full=False)  # unique_on: `full` does not count
    assert caught.value.task_id == first.id
    holder = dedupe.lookup(sync, (5,))
    assert holder is not None
    assert holder.ttl is not None
    assert holder.ttl <= 45


def test_a_unique_key_declared_on_the_task_decides_the_key(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()

    def by_tenant(tenant: str, item: int) -> str:
        return tenant

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_key=by_tenant)
    def reindex(tenant: str, item: int) -> None: ...

    first = reindex.delay("acme", 1)
    assert reindex.delay("acme", 2).id == first.id
    assert reindex.delay("globex", 1).id != first.id


def test_a_bad_task_option_names_the_task_and_the_option(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_until="done")
    def job(x: int) -> None: ...

    with pytest.raises(dedupe.ConfigurationError, match=r"unique_until") as caught:
        job.delay(1)
    assert job.name in str(caught.value)


# -- reading Celery's own settings on the hot path ---------------------------------------------


class _Settings:
    task_always_eager = True


class _DjangoSettings:
    CELERY_TASK_ALWAYS_EAGER = True


@pytest.mark.parametrize(
    ("configure", "expected"),
    [
        (lambda app: None, False),
        (lambda app: app.conf.update(task_always_eager=True), True),
        (lambda app: app.conf.update(CELERY_ALWAYS_EAGER=True), True),  # the old name
        (lambda app: app.config_from_object(_Settings), True),
        (lambda app: app.config_from_object(_DjangoSettings, namespace="CELERY"), True),
    ],
    ids=["default", "set", "old-name", "object", "django-namespace"],
)
def test_a_setting_is_read_as_app_conf_reads_it(
    configure: Callable[[Celery], None], expected: bool
) -> None:
    from dedupe.values.config import SettingReader

    app = bare_app("redis://cache:6379/0")
    configure(app)
    always_eager = SettingReader("task_always_eager")
    assert always_eager(app) is expected
    assert app.conf["task_always_eager"] is expected


def test_a_setting_changed_after_the_first_read_is_seen() -> None:
    from dedupe.values.config import SettingReader

    app = bare_app("redis://cache:6379/0")
    always_eager = SettingReader("task_always_eager")
    assert always_eager(app) is False
    app.conf.task_always_eager = True
    assert always_eager(app) is True


def test_one_reader_serves_several_apps() -> None:
    from dedupe.values.config import SettingReader

    eager, lazy = bare_app("redis://a//", task_always_eager=True), bare_app("redis://b//")
    always_eager = SettingReader("task_always_eager")
    assert [always_eager(eager), always_eager(lazy), always_eager(eager)] == [True, False, True]
