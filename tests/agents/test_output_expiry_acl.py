"""A node's Redis ACL user and the expiry of its output streams: it may set the TTL of its own
session and tunnel output streams (so they go though nobody reads them), and EXPIRE nothing else:
not another node's output, not its own command, input, event streams or heartbeat. A node whose
ACL user predates that still ships its output (without a TTL) rather than failing."""

from urllib.parse import urlsplit

import redis as redis_lib

from agents import protocol, sessions, signing, tunnel, tunnel_protocol
from tests.agents.test_redis_acl import SECRET, _refused, acl_users, redis_7  # noqa: F401  (fixtures)

CONN = "cd" * 16


def test_a_node_user_sets_the_ttl_of_its_own_output_streams_and_of_nothing_else(redis_client, acl_users):
    own = {protocol.session_output_stream("node-a", 7): sessions.OUTPUT_KEPT_S,
           tunnel_protocol.tunnel_output_stream("node-a", CONN): tunnel.OUTPUT_KEPT_S}
    others = [protocol.session_output_stream("node-b", 7), tunnel_protocol.tunnel_output_stream("node-b", CONN),
              protocol.command_stream("node-a"), protocol.heartbeat_key("node-a"),
              protocol.session_input_stream("node-a"), tunnel_protocol.tunnel_input_stream("node-a"),
              protocol.node_events_stream("node-a"), protocol.node_logs_stream("node-a")]
    for key in [*own, *others]:
        redis_client.xadd(key, {"m": "x"}) if key != protocol.heartbeat_key("node-a") else redis_client.set(key, "{}")
    node_a = acl_users("node-a")

    pipe = node_a.pipeline(transaction=False)  # as the agent ships output: XADD then EXPIRE, one round trip
    for key, kept_s in own.items():
        pipe.xadd(key, {"m": "y"}, maxlen=1000, approximate=True)
        pipe.expire(key, kept_s)
    pipe.execute()
    assert {key: 0 < redis_client.ttl(key) <= kept_s for key, kept_s in own.items()} == {key: True for key in own}

    assert [key for key in others if not _refused(lambda key=key: node_a.expire(key, 1))] == []
    assert all(redis_client.ttl(key) == -1 for key in others)
    # EXPIRE is all it may do there besides appending: no reading back, no deleting.
    forbidden = {"DEL": lambda key: node_a.delete(key), "XRANGE": lambda key: node_a.xrange(key),
                 "PERSIST": lambda key: node_a.persist(key)}
    assert [(what, key) for what, call in forbidden.items() for key in own
            if not _refused(lambda call=call, key=key: call(key))] == []


def test_a_node_user_made_before_it_could_expire_still_ships_tunnel_answers(redis_url, redis_client, acl_users,
                                                                            tmp_path):
    password = signing.redis_password(SECRET, "node-a")
    old_rules = [rule for rule in signing.redis_acl_rules("node-a", password) if "+expire" not in rule]
    admin = redis_lib.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", signing.redis_user("node-a"), *old_rules)
    admin.close()
    parts = urlsplit(redis_url)
    old = redis_lib.Redis.from_url(f"redis://{signing.redis_user('node-a')}:{password}@{parts.netloc}{parts.path}")
    relay = tunnel.TunnelRelay("node-a", redis_url, b"k" * 32, lambda job_id: tmp_path)
    stream = tunnel_protocol.tunnel_output_stream("node-a", CONN)
    relay._out = [(stream, {"m": "answer"})]
    try:
        relay._flush(old)  # EXPIRE refused: warned about, not raised
    finally:
        old.close()
    assert redis_client.xlen(stream) == 1 and redis_client.ttl(stream) == -1
