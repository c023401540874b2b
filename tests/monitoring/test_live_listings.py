"""What each node says it runs is kept beside its sample, with a token that moves exactly when
one of those listings does, whichever ingest process wrote it."""

import time

import redis as redis_lib

from agents import protocol
from monitoring.services import live


def sample(jobs, node="n1"):
    return protocol.NodeSample(node=node, ts=time.time(), seq=1, gpus=[], running_jobs=jobs,
                               running_launches=[f"launch-{j}-1" for j in jobs], duty_cycles=[1.0] * len(jobs))


def stored(client, node="n1"):
    return client.hget(live.LISTING_HASH, node)


def test_the_token_moves_when_a_listing_changes_and_only_then(redis_client):
    live.store_latest(redis_client, [sample([1, 2]), sample([3], node="n2")])
    first = live.listings_token(redis_client)
    live.store_latest(redis_client, [sample([1, 2])])  # a new sample, the same jobs
    assert live.listings_token(redis_client) == first
    live.store_latest(redis_client, [sample([1])])
    assert live.listings_token(redis_client) not in (None, first)
    assert stored(redis_client) == live.listing_of(sample([1]))


def test_two_writers_never_leave_a_listing_stale(redis_client, redis_url):
    """Ingest processes share the stream: each knows only what it wrote, until another moves the token."""
    other = redis_lib.Redis.from_url(redis_url)
    live.store_latest(redis_client, [sample([1])])
    live.store_latest(other, [sample([2])])
    before = live.listings_token(redis_client)
    live.store_latest(redis_client, [sample([1])])  # what this writer last wrote, no longer what is stored
    assert stored(redis_client) == live.listing_of(sample([1]))
    assert live.listings_token(redis_client) != before
    other.close()


def test_pruning_a_node_moves_the_token_and_drops_its_listing(redis_client):
    live.store_latest(redis_client, [protocol.NodeSample(node="old", ts=time.time() - 3600, seq=1, gpus=[])])
    before = live.listings_token(redis_client)
    assert live.prune_stale(redis_client) == 1
    assert stored(redis_client, "old") is None
    assert live.listings_token(redis_client) != before
    live.store_latest(redis_client, [protocol.NodeSample(node="old", ts=time.time(), seq=2, gpus=[])])
    assert stored(redis_client, "old") is not None


def test_a_batch_of_many_thousand_nodes_is_stored_whole(redis_client):
    nodes = [f"n{i}" for i in range(6000)]
    live.store_latest(redis_client, [sample([1], node=node) for node in nodes])
    assert redis_client.hlen(live.NODE_HASH) == redis_client.hlen(live.LISTING_HASH) == 6000
