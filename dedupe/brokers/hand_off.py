"""A waiting call handed a slot, published: the call a worker held in its key's line (its
message, which came with no slot, ended its delivery) goes out again with Celery's options
kept in Redis, under its task id, through ``send_task`` (no import of the task needed).

A call held by the producer on a Redis broker that is the dedup store is pushed by the script
that hands it its slot: it never reaches this module (:class:`~dedupe.store.commands.lines.Handed`
with no options)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery
from kombu.utils.json import loads

from dedupe.store.commands.lines import Handed
from dedupe.values.header import publishing

__all__ = ["publish_handed", "publish_held"]

logger = logging.getLogger("dedupe.worker")


def publish_handed(app: Celery, key: str, handed: Sequence[Handed]) -> None:
    """Publish each call of ``handed`` the script did not push. A publish that fails is
    logged: its handed slot lapses within a lease and the call is handed on again."""
    for call in handed:
        if not call.options:
            logger.info(
                "%s leaves the line of %s: a slot freed, its message pushed", call.task_id, key
            )
            continue
        try:
            held: dict[str, Any] = loads(call.options)
            publish_held(app, held, call.task_id)
        except Exception as exc:
            logger.warning(
                "%s was handed a slot of %s and could not be published (%r): the slot lapses "
                "within its lease and is handed to it again",
                call.task_id,
                key,
                exc,
            )
            continue
        logger.info("%s[%s] leaves the line of %s: a slot freed", held["task"], call.task_id, key)


def publish_held(
    app: Celery, held: Mapping[str, Any], task_id: str, countdown: float | None = None
) -> None:
    """Publish a call kept for its turn (task, arguments and Celery's options, as
    ``_held_options`` keeps them) under ``task_id``, ``countdown`` seconds from now (its
    backstop) or at once."""
    options = dict(held["options"])
    options.pop("task_id", None)
    for timing in ("countdown", "eta"):
        options.pop(timing, None)
    if countdown is not None:
        options["countdown"] = countdown
    with publishing():
        app.send_task(
            held["task"],
            args=held["args"],
            kwargs=held["kwargs"],
            task_id=task_id,
            add_to_parent=False,
            **options,
        )
