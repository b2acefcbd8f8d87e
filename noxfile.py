"""Sessions: ``tests`` and ``lint`` run by default (and in CI); ``fast``, ``demo`` and ``bench``
on demand.

Use ``./noxw`` on a machine without nox: it makes a private virtualenv for nox first.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"
# Run on the listed Pythons that this machine has; skip the others rather than fail.
nox.options.error_on_missing_interpreters = False

PYTHONS = nox.project.python_versions(nox.project.load_toml("pyproject.toml"))


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the test suite: a private redis-server, real Celery workers, RabbitMQ if present."""
    session.install("-e", ".[test,examples]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHONS)
def fast(session: nox.Session) -> None:
    """Run the tests not marked slow: no worker, beat or web server process, no long wait."""
    session.install("-e", ".[test,examples]")
    session.run("pytest", "-m", "not slow", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) over everything, mypy --strict over dedupe/."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def demo(session: nox.Session) -> None:
    """Run the demo: 100 identical calls become one published task and one run."""
    session.install("-e", ".[demo]")
    session.run("python", "-m", "dedupe.demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks; results go to benchmarks/results/."""
    session.install("-e", ".[bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)
