"""kombu's declaration cache, looked at before kombu binds an entity (see
:func:`declaring_once`)."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager as ContextManager

from dedupe.surfaces import ChannelSurface, ProducerSurface

from .shadowing import shadowing

__all__ = ["all_declared", "declaring_once"]


def declaring_once(producer: ProducerSurface) -> ContextManager[None]:
    """kombu's ``Producer.maybe_declare`` on ``producer`` for the block, with the look in its
    connection's declaration cache made first.

    kombu binds an unbound entity (the queue Celery routes a call to) to the channel before
    that look, and binding copies it: about a tenth of a publish to RabbitMQ, every call, for
    a queue declared at the connection's first publish. The look is kombu's own, made on
    each try of the publish (a reconnect's empty cache declares again); an entity not found
    goes to kombu. ``before_task_publish`` still sees Celery's ``declare``."""
    kombu_maybe_declare = type(producer).maybe_declare

    def maybe_declare(entity: object, retry: bool = False, **retry_policy: object) -> bool:
        if entity and _declared(producer.channel, entity):
            return False  # (what kombu's maybe_declare returns for a cached declaration)
        return kombu_maybe_declare(producer, entity, retry, **retry_policy)

    return shadowing(producer, maybe_declare=maybe_declare)


def _declared(channel: ChannelSurface, entity: object) -> bool:
    """Would kombu's ``maybe_declare`` find ``entity`` declared on ``channel``'s connection?"""
    connection = getattr(channel, "connection", None)
    if connection is None or not getattr(entity, "can_cache_declaration", False):
        return False  # (a closed channel: kombu revives the entity and declares it again)
    return hash(entity) in connection.client.declared_entities


def all_declared(channel: ChannelSurface, entities: Iterable[object]) -> bool:
    """Would kombu's ``maybe_declare`` find each of ``entities`` declared, and return?"""
    return all(_declared(channel, entity) for entity in entities)
