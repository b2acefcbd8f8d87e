"""Sessions: ``tests`` and ``lint`` run by default (and in CI, with ``docs``); ``fast``, ``compat``,
``compat-newest``, ``demo``, ``bench``, ``soak`` and ``chaos`` on demand.

Use ``./noxw`` on a machine without nox: it makes a private virtualenv for nox first.
"""

from __future__ import annotations

import glob
import html
import os
import re
import shutil

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"
# Run on the listed Pythons that this machine has; skip the others rather than fail.
nox.options.error_on_missing_interpreters = False

PYTHONS = nox.project.python_versions(nox.project.load_toml("pyproject.toml"))


def _find_pyenv_pythons() -> None:
    """Put pyenv's installed but inactive Pythons on PATH, so that ``fast`` finds them."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for version in PYTHONS:
        if shutil.which(f"python{version}") and not _is_pyenv_shim(f"python{version}"):
            continue
        found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin")))
        if found:
            os.environ["PATH"] = found[-1] + os.pathsep + os.environ["PATH"]


def _is_pyenv_shim(command: str) -> bool:
    # A shim exists for every Python pyenv has, but runs only the globally selected ones.
    return os.sep + "shims" + os.sep in (shutil.which(command) or "")


_find_pyenv_pythons()

# Each Celery minor with the kombu minor released beside it and the newest redis-py that kombu's
# `redis` extra admits, then the oldest redis-py admitted at each end. Celery 5.7's kombu asks for
# redis>=6.4, so no Celery 5.7 install can have redis-py 5 (see the README's tested matrix).
COMPAT = {
    "celery5.3-redis5.3": ("5.3.6", "5.3.7", "5.3.1"),
    "celery5.4-redis5.3": ("5.4.0", "5.4.2", "5.3.1"),
    "celery5.5-redis5.2": ("5.5.3", "5.5.4", "5.2.1"),
    "celery5.6-redis6.4": ("5.6.3", "5.6.2", "6.4.0"),
    "celery5.7-redis8.1": ("5.7.0", "5.7.0", "8.1.0"),
    "celery5.3-redis5.0": ("5.3.6", "5.3.7", "5.0.0"),
    "celery5.7-redis6.4": ("5.7.0", "5.7.0", "6.4.0"),
}
# What the compat session runs: everything that touches Celery, kombu or redis-py internals
# (the publish seam, the worker's signals and pool hooks, beat, the script runner).
COMPAT_TESTS = [
    "tests/test_imports.py",
    "tests/test_script_runner.py",
    "tests/test_store.py",
    "tests/test_producer.py",
    "tests/test_one_step_publish.py",
    "tests/test_remembered_duplicates.py",
    "tests/test_unknown_fate.py",
    "tests/test_async.py",
    "tests/test_canvas.py",
    "tests/test_worker_inprocess.py",
    "tests/test_worker_prefork.py",
    "tests/test_revoked_waiting.py",
    "tests/test_main_process.py",
    "tests/test_beat.py",
    "tests/test_beat_mixin.py",
    "tests/test_beat_ticks.py",
    "tests/test_bulk.py",
    "tests/test_bulk_messages.py",
    "tests/test_single_messages.py",
    "tests/test_sentinel.py",
    "tests/test_cluster.py",
    "tests/test_call_nonce.py",
    "tests/test_heartbeat.py",
    "tests/test_restore.py",
    "tests/test_held_messages.py",
    "tests/test_broker_budget.py",
    "tests/test_late_replies.py",
    "tests/test_loud_failures.py",
    "tests/test_run_end_truth.py",
    "tests/test_confirm_truth.py",
    "tests/test_tracing.py",
    "tests/test_publish_signals.py",
    "tests/test_interrupted_calls.py",
    "tests/test_compat.py",
]


#: Test processes of the ``tests`` session (``DEDUPE_TEST_PROCESSES=0``: one, no xdist). Each
#: test file runs whole in one process, so module fixtures (a Cluster, Sentinels) start once.
TEST_PROCESSES = os.environ.get("DEDUPE_TEST_PROCESSES", "2")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite on nox's Python: private redis-servers, real workers, RabbitMQ."""
    session.install("-e", ".[test,examples]")
    session.run("pytest", "-n", TEST_PROCESSES, "--dist", "loadfile", *session.posargs)


@nox.session(python=PYTHONS)
def fast(session: nox.Session) -> None:
    """Run the tests not marked slow on every supported Python found (pyenv's too)."""
    session.install("-e", ".[test,examples]")
    session.run("pytest", "-m", "not slow", *session.posargs)


@nox.session
@nox.parametrize("stack", list(COMPAT), ids=list(COMPAT))
def compat(session: nox.Session, stack: str) -> None:
    """Run the producer, worker and beat tests on an older Celery, kombu and redis-py."""
    celery, kombu, redis = COMPAT[stack]
    session.install(
        "-e", ".[test]", f"celery[redis]=={celery}", f"kombu=={kombu}", f"redis=={redis}"
    )
    session.run("pip", "list", "--format=freeze", silent=False)
    session.run("pytest", "-m", "not soak", *(session.posargs or COMPAT_TESTS))


@nox.session(name="compat-newest")
def compat_newest(session: nox.Session) -> None:
    """Run the compat tests on the newest Celery, kombu and redis-py releases (the next row of
    the matrix, met before users meet it: a new release that moves a private member fails
    here first)."""
    session.install("-e", ".[test]")
    session.install("--upgrade", "celery[redis]", "kombu", "redis")
    session.run("pip", "list", "--format=freeze", silent=False)
    session.run("pytest", "-m", "not soak", *(session.posargs or COMPAT_TESTS))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) over everything, mypy --strict over dedupe/ (the web view's
    modules too: the web extra is installed for them)."""
    session.install("-e", ".[lint,web]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def demo(session: nox.Session) -> None:
    """Run the demo: 100 identical calls become one published task and one run."""
    session.install("-e", ".[demo]")
    session.run("python", "-m", "dedupe.demo", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the docs site (mkdocs.yml, docs/) with --strict: a broken link or reference fails,
    and so does reST markup that mkdocstrings printed as text (docstrings are Markdown)."""
    session.install("-e", ".[docs]")
    site = ".nox/docs-site"
    session.run("mkdocs", "build", "--strict", "--site-dir", site)
    found = raw_markup(site)
    if found:
        session.error("reST markup printed as text in the built docs:\n" + "\n".join(found))


#: reST that Markdown prints as it stands: a directive (``.. code-block:: python``), a role
#: (``:class:`X``` shows as ":class:X"), a literal block's "::" ending a paragraph.
RAW_MARKUP = re.compile(
    r"^\s*\.\. [a-z][\w-]*::"
    r"|(?<![\w:]):(?:class|meth|func|attr|mod|exc|data|obj|const|ref|doc|term|py:\w+):(?=\S)"
    r"|\w::$",
    re.MULTILINE,
)


def raw_markup(site: str) -> list[str]:
    """Where the built pages show reST markup as text: "page: ...context...", one a line."""
    found = []
    for page in sorted(glob.glob(os.path.join(site, "**", "*.html"), recursive=True)):
        with open(page, encoding="utf-8") as file:
            text = file.read()
        # A code sample may hold "::" (a Celery scheduler path, a slice); prose may not.
        text = re.sub(r"<pre\b.*?</pre>", "", text, flags=re.DOTALL)
        text = html.unescape(re.sub(r"<[^>]+>", "", text))
        for match in RAW_MARKUP.finditer(text):
            context = text[max(0, match.start() - 40) : match.end() + 40]
            found.append(f"{os.path.relpath(page, site)}: {' '.join(context.split())}")
    return found


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks; results go to benchmarks/results/."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """Run producers and a prefork worker under steady load and fail if memory, keys,
    connections or descriptors grow after warm-up (an hour by default; arguments after -- go
    to benchmarks/soak.py: ``-- --minutes 15``, ``--help`` lists them)."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "benchmarks.soak", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """Run the chaos scenario (kills, a dedup-Redis restart, a broker cut) on both brokers;
    arguments after -- go to tests/chaos/run.py (--help lists them)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.chaos", *session.posargs)
