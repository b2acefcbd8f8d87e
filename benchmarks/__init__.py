"""Benchmarks of celery-dedupe: ``python -m benchmarks`` (or ``./noxw -s bench``)."""
