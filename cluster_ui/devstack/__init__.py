"""The developer stack: ``python -m cluster_ui.devstack`` brings Colony up on embedded defaults.

Nothing here imports Django at module level: the supervisor starts Django, Celery and the agents
as child processes, and the test suite reuses :mod:`.redis_server` for a private Redis.
"""
