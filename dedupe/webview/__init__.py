"""``celery -A proj dedupe web``: a live web view of the dedup keys (``pip install
'celery-dedupe[web]'``).

Only :mod:`~dedupe.webview.recorder` is imported where the app runs (by ``dedupe.install``):
it logs the events the view shows, and only while a view runs. The rest is imported when the
server starts, with the ``web`` extra (Starlette, uvicorn). The docs: docs/web-view.md.
"""
