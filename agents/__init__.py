"""Colony's node agent: runs jobs on one GPU node and reports to the control plane over Redis.

Plain Python. Nothing in this package may import Django, Django REST framework or Celery: the
agent runs on GPU nodes that carry none of the web stack, and the server imports
:mod:`agents.protocol` from here (a test checks this in a fresh interpreter).
"""

__version__ = "0.2.0"
