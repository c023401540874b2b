"""What node health reads of the latest samples: the same nodes, times and job listings as the
full decoding gives, and the same entries passed over."""

from __future__ import annotations

import json
import time

from agents import protocol
from monitoring.services import health_samples, live


def test_node_health_reads_what_the_full_samples_say_and_passes_over_what_they_pass_over(redis_client):
    now = time.time()
    live.store_latest(redis_client, [
        protocol.NodeSample(node="a", ts=now, seq=1, gpus=[protocol.GpuSample(index=0, util_sm=50.0)],
                            running_jobs=[7, 9], running_launches=["launch-7-0", "launch-9-2"], duty_cycles=[1.0, 0.5]),
        protocol.NodeSample(node="b", ts=now - 1, seq=1, gpus=[], running_jobs=[]),
        protocol.NodeSample(node="old", ts=now - 600, seq=1, gpus=[], running_jobs=[3]),
    ])
    # Written by something other than the ingest: readings that are not lists, a time that is not one.
    redis_client.hset(live.NODE_HASH, mapping={
        "odd": json.dumps({"ts": now, "gpus": {"0": {}}, "running_jobs": [4]}),
        "bool": json.dumps({"ts": True, "gpus": [], "running_jobs": [5]}),
        "older-agent": json.dumps({"ts": now, "gpus": [], "jobs": [], "running_jobs": [6]}),
    })

    full, read = live.latest_nodes(redis_client), health_samples.latest_listings(redis_client)

    assert set(read) == set(full) == {"a", "b", "older-agent"}
    for node, sample in full.items():
        for field in ("running_jobs", "running_launches", "duty_cycles"):
            assert read[node].get(field) == sample.get(field), (node, field)
        assert read[node]["ts"] == sample["ts"]
    assert read["older-agent"].get("running_launches") is None  # (an agent that does not list attempts)
