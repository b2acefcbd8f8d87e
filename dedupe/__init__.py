"""celery-dedupe: stop Celery from queueing, or running, the same work twice.

```python
import dedupe
app = Celery("proj", broker="redis://localhost:6379/0")
dedupe.install(app)

@app.task(base=dedupe.DedupeTask, unique=True)
def sync_customer(customer_id, full=False): ...

sync_customer.delay(42).deduplicated      # False
sync_customer.delay(42).deduplicated      # True: the first one is still queued or running
```
"""

from __future__ import annotations

from . import events
from .errors import (
    AlreadyQueued,
    ArgumentsTooLarge,
    ConfigurationError,
    DedupeError,
    KeyDerivationError,
    NotInstalled,
    RecordFormatError,
    RedisCommandError,
    RedisUnavailable,
    UnexpectedReply,
)
from .installer import install
from .producer.aio import aapply_async, alookup
from .producer.bulk import aapply_many, apply_many
from .producer.guard import apply_async, clear, lookup
from .producer.result import DedupeResult
from .task import DedupeTask
from .values.record import Holder
from .web import response_for

__all__ = [
    "AlreadyQueued",
    "ArgumentsTooLarge",
    "ConfigurationError",
    "DedupeError",
    "DedupeResult",
    "DedupeTask",
    "Holder",
    "KeyDerivationError",
    "NotInstalled",
    "RecordFormatError",
    "RedisCommandError",
    "RedisUnavailable",
    "UnexpectedReply",
    "aapply_async",
    "aapply_many",
    "alookup",
    "apply_async",
    "apply_many",
    "clear",
    "events",
    "install",
    "lookup",
    "response_for",
]

__version__ = "0.1.0"
