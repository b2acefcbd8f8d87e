"""A FastAPI app that refreshes reports through celery-dedupe's async guard."""
