"""Key digests and records packed by many threads at once are each thread's own, on msgpack's
pure-Python implementation too (MSGPACK_PUREPYTHON=1: PyPy, platforms without the C one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from .helpers import ROOT

pytestmark = pytest.mark.slow

RACE = textwrap.dedent(
    """
    import threading

    import msgpack

    from dedupe.values.key_derivation import call_digest
    from dedupe.values.record import pack_queued

    assert msgpack.Packer.__module__ == {module!r}, msgpack.Packer.__module__
    CALLS = [(f"customer-{{n}}", {{"n": n, "tags": ["a" * (n % 50)]}}) for n in range(4000)]

    def work(call):
        name, kwargs = call
        digest = call_digest("jobs.sync", None, (name,), kwargs)
        n = kwargs["n"]
        return digest, pack_queued(f"id-{{n}}", 1.5 * n, None, nonce=n)

    expected = [work(call) for call in CALLS]
    wrong = []

    def racer():
        for _ in range(5):
            for call, want in zip(CALLS, expected):
                got = work(call)
                if got != want:
                    wrong.append(call)

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(len(wrong))
    """
)


@pytest.mark.parametrize(
    ("pure_python", "module"), [(True, "msgpack.fallback"), (False, "msgpack._cmsgpack")]
)
def test_threads_packing_at_once_each_get_their_own_keys_and_records(
    pure_python: bool, module: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MSGPACK_PUREPYTHON", None)
    if pure_python:
        env["MSGPACK_PUREPYTHON"] = "1"
    ran = subprocess.run(
        [sys.executable, "-c", RACE.format(module=module)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "0"
