"""The worker's look at its key prefix's lines (``key_concurrency``): a slot handed to a
message that never started (a killed worker's prefetch, a lost publish, a releasing worker
that died before it published) or held by a run whose whole worker died is over once its
lease is; with nothing else happening on its key, this look hands it on (hand_on.lua), so a
line never waits on a dead message for more than a lease and a look. The same look sees the
dedup Redis restart or fail over (its run id changes): every line then settles for a lease
(settle.lua), so that no new run starts beside a live run whose slot was lost before its
heartbeat counts it again. It also keeps the names of the limited tasks in Redis
(:mod:`dedupe.runs.limited_names`).

One daemon thread in the worker's main process, two round trips a second; not on a Cluster
(the index names lines of many slots): there a lapsed slot is handed on by the key's next
call, run or end.
"""

from __future__ import annotations

import logging
import threading
import time

from dedupe.errors import DedupeError
from dedupe.runs.runtime import Runtime
from dedupe.values.limits import lines_index
from dedupe.values.timing import milliseconds

from .limited_names import EVERY as NAMES_EVERY
from .limited_names import name_limited_tasks

__all__ = ["LineSweep"]

logger = logging.getLogger("dedupe.worker")

#: Seconds between looks.
EVERY = 1.0


class LineSweep:
    """Hands on the lapsed slots of ``runtime``'s lines, every :data:`EVERY` seconds."""

    def __init__(self, runtime: Runtime, every: float = EVERY) -> None:
        self._runtime = runtime
        self._every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The server's run id at the last look ('' before the first).
        self._seen = ""
        #: When the limited task names are written again (monotonic; 0: at the first look).
        self._names_due = 0.0

    def start(self) -> None:
        if self._runtime.store.server is None:
            name_limited_tasks(self._runtime)  # (a Cluster: at start only)
            return
        self._thread = threading.Thread(target=self._loop, name="dedupe-lines", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def look(self) -> None:
        """One look: after a loss of the dedup Redis's data, the lines settle for a lease
        (settle.lua); then hand on the lapsed slots of every line whose first lease is
        over."""
        runtime = self._runtime
        index = lines_index(runtime.config.key_prefix)
        lease_ms = milliseconds(runtime.config.default_lease)
        run = runtime.store.server_run().decode()  # ('' where INFO is refused: no settling)
        restarted = bool(run and self._seen and run != self._seen)
        if restarted and runtime.store.settle_lines(index, self._seen, run, lease_ms):
            logger.warning(
                "the dedup Redis restarted or failed over: the lines of key_concurrency "
                "keys settle for %.0f s, while the live runs count their slots again",
                lease_ms / 1000,
            )
        self._seen = run or self._seen
        now = time.monotonic()
        if restarted or now >= self._names_due:
            name_limited_tasks(runtime)
            self._names_due = now + NAMES_EVERY
        handed = runtime.store.hand_on_lapsed(index)
        if handed:
            runtime.broker.hand_off(runtime.app, index, handed)

    def _loop(self) -> None:
        # The first look at once: it learns the server's run id, to tell a restart later.
        while True:
            try:
                self.look()
            except DedupeError as exc:  # (Redis away a while: the next look tries again)
                logger.debug("no look at the lines: %s", exc)
            except Exception:
                logger.exception("the look at the lines failed")
            if self._stop.wait(self._every):
                return
