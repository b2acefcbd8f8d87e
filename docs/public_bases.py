"""A Griffe extension for the API reference: a class whose base is one of the package's
private aliases of a Celery class shows that Celery class instead ("Bases: celery.Task", not
"Bases: AnyTask": the alias exists only to make Celery's generic types fit the type checker).

Loaded by mkdocs.yml (mkdocstrings' `extensions`); not part of the site (`exclude_docs`).
"""

from __future__ import annotations

from typing import Any

import griffe

#: The package's aliases of Celery classes, by the path griffe resolves them to.
PUBLIC = {
    "dedupe.surfaces.AnyTask": "celery.Task",
    "dedupe.surfaces.AnyAsyncResult": "celery.result.AsyncResult",
    "dedupe.django._DjangoTask": "celery.contrib.django.task.DjangoTask",
    "dedupe.beat._SchedulerBase": "celery.beat.Scheduler",
}


class PublicBases(griffe.Extension):
    def on_class_instance(self, *, cls: griffe.Class, **_: Any) -> None:
        cls.bases = [PUBLIC.get(getattr(base, "canonical_path", ""), base) for base in cls.bases]
