"""Reading a Celery setting on the hot path of every call.

``app.conf["task_always_eager"]`` costs a producer call as much as the rest of deciding it:
Celery's settings view spells the name every way it may be written (old and new names, the
namespace prefix) anew on each read, and raises and catches a KeyError for each mapping
that does not hold it (most apps set it nowhere, so it is found only in the defaults).
:class:`SettingReader` spells the name once per settings object, then looks it up in the
same mappings, in the same order, without raising: the same answer, several times cheaper.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.utils.collections import ConfigurationView

__all__ = ["SettingReader"]


class SettingReader:
    """Reads one setting of an app as ``app.conf[name]`` would.

    >>> always_eager = SettingReader("task_always_eager")
    >>> always_eager(app)
    False
    """

    __slots__ = ("_name", "_spelled")

    def __init__(self, name: str) -> None:
        self._name = name
        #: (the settings object, the keys its view looks the name up under), cached together
        #: so that threads never see one without the other.
        self._spelled: tuple[Any, tuple[Any, ...]] | None = None

    def __call__(self, app: Celery) -> Any:
        conf: Any = app.conf  # a PendingConfiguration until the app is finalized
        spelled = self._spelled
        if spelled is None or spelled[0] is not conf:
            if not isinstance(conf, ConfigurationView):
                # Not finalized yet: the plain read finalizes it.
                return conf[self._name]
            spelled = self._spelled = (conf, self._spell(conf))
        keys = spelled[1]
        for mapping in conf.maps:
            for key in keys:
                if key in mapping:
                    return mapping[key]
        return conf[self._name]  # found nowhere: let Celery answer (or raise) as it would

    def _spell(self, conf: ConfigurationView) -> tuple[Any, ...]:
        # The keys ConfigurationView.__getitem__ tries, in its order (it has no public way to
        # ask for them); if that changes shape, read the plain way.
        try:
            return tuple(conf._key(key) for key in conf._to_keys(self._name))
        except (AttributeError, TypeError):
            return ()
