"""Which kind of broker an app has, decided once (the runtime keeps the answer)."""

from __future__ import annotations

from celery import Celery

from .broker import Broker
from .other_broker import OtherBroker
from .redis_broker import RedisBroker
from .server import ServerAddress

__all__ = ["broker_of"]


def broker_of(app: Celery) -> Broker:
    """The broker of ``app``: kombu's Redis transport (redis, rediss, sentinel, socket), or
    any other. Reads the app's broker URL; connects to nothing."""
    connection = app.connection_for_write()  # not connected: names the transport
    try:
        if getattr(connection.transport, "driver_type", None) != "redis":
            return OtherBroker(app)
        address = ServerAddress.of_broker(
            connection.hostname, connection.port, connection.virtual_host
        )
    finally:
        connection.release()
    return RedisBroker(app, address)
