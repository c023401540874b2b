"""Trace replay: the production scheduler core on a virtual clock, beside baseline policies.

``loaders`` read the public traces into a ``trace.Trace``; ``engine.replay`` drives one policy
over it; ``metrics`` turns a replay into the figures operators compare (JCT, queueing delay,
utilisation, fairness, fragmentation); ``report`` prints them and writes JSON and HTML.
Pure like the rest of ``jobs.scheduling``: no Django, no Redis, no wall clock.
Run it with ``python -m jobs.scheduling.simulate --help``.
"""

from jobs.scheduling.simulate.engine import Replay, ReplayResult, replay
from jobs.scheduling.simulate.trace import NodeSpec, Trace, TraceJob

__all__ = ["NodeSpec", "Replay", "ReplayResult", "Trace", "TraceJob", "replay"]
