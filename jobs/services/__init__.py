"""Work that touches the database and Redis for jobs: submission, cancel, the scheduling cycle,
agent events. Celery tasks and views call these; they hold no request or task state."""
