"""The latest sample per GPU, per job and per node, kept in Redis hashes for live views.

One HSET per hash per batch. Entries carry their sample time; readers treat old ones as gone
(a finished job's entry simply ages out and the prune task deletes it).
"""

from __future__ import annotations

import json
import time

import redis

from agents.protocol import NodeSample

GPU_HASH = "colony:live:gpu"  # field "node:index"
JOB_HASH = "colony:live:job"  # field job id
NODE_HASH = "colony:live:node"  # field node name
STALE_AFTER_S = 30.0


def gpu_field(node: str, index: int) -> str:
    return f"{node}:{index}"


def store_latest(client: redis.Redis, samples: list[NodeSample]) -> None:
    latest: dict[str, NodeSample] = {}
    for sample in samples:
        if sample.node not in latest or latest[sample.node].ts <= sample.ts:
            latest[sample.node] = sample
    gpus, jobs, nodes = {}, {}, {}
    for sample in latest.values():
        nodes[sample.node] = json.dumps({"ts": sample.ts, "seq": sample.seq, "running_jobs": sample.running_jobs})
        for gpu in sample.gpus:
            gpus[gpu_field(sample.node, gpu.index)] = json.dumps({
                "ts": sample.ts, "util_sm": gpu.util_sm, "util_mem": gpu.util_mem, "mem_used_mib": gpu.mem_used_mib,
                "mem_total_mib": gpu.mem_total_mib, "temperature_c": gpu.temperature_c, "power_w": gpu.power_w,
            })
        per_job: dict[int, dict] = {}
        for usage in sample.jobs:
            entry = per_job.setdefault(usage.job_id, {"ts": sample.ts, "node": sample.node, "gpus": {}})
            entry["gpus"][usage.gpu_index] = {"mem_used_mib": usage.mem_used_mib, "util_sm": usage.util_sm}
        jobs.update({str(job_id): json.dumps(entry) for job_id, entry in per_job.items()})
    pipe = client.pipeline(transaction=False)
    for key, mapping in ((GPU_HASH, gpus), (JOB_HASH, jobs), (NODE_HASH, nodes)):
        if mapping:
            pipe.hset(key, mapping=mapping)
    pipe.execute()


def _fresh(raw: dict, now: float, max_age: float) -> dict:
    out = {}
    for field, value in raw.items():
        entry = json.loads(value)
        if now - entry["ts"] <= max_age:
            out[field.decode() if isinstance(field, bytes) else field] = entry
    return out


def latest_gpus(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[str, dict]:
    return _fresh(client.hgetall(GPU_HASH), time.time(), max_age)


def latest_jobs(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[int, dict]:
    return {int(k): v for k, v in _fresh(client.hgetall(JOB_HASH), time.time(), max_age).items()}


def latest_nodes(client: redis.Redis, max_age: float = STALE_AFTER_S) -> dict[str, dict]:
    return _fresh(client.hgetall(NODE_HASH), time.time(), max_age)


def prune_stale(client: redis.Redis, older_than: float = 600.0) -> int:
    now, removed = time.time(), 0
    for key in (GPU_HASH, JOB_HASH, NODE_HASH):
        stale = [f for f, v in client.hgetall(key).items() if now - json.loads(v)["ts"] > older_than]
        if stale:
            removed += client.hdel(key, *stale)
    return removed
