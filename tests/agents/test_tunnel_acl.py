"""A node's Redis ACL user and the notebook tunnel: it reads (XREAD, no more) only its own tunnel
input and appends only to its own connections' output streams; it can neither write tunnel input
(its own or another node's), nor read another node's, nor write or read back another node's answers."""

from agents import tunnel_protocol
from tests.agents.test_redis_acl import _refused, acl_users, redis_7  # noqa: F401  (fixtures)

CONN = "ab" * 16


def test_a_node_user_reads_only_its_own_tunnel_input_and_writes_only_its_own_answers(redis_client, acl_users):
    redis_client.xadd(tunnel_protocol.tunnel_input_stream("node-a"), {"m": "bytes for node-a"})
    redis_client.xadd(tunnel_protocol.tunnel_input_stream("node-b"), {"m": "bytes for node-b"})
    node_a = acl_users("node-a")

    assert len(node_a.xread({tunnel_protocol.tunnel_input_stream("node-a"): "0"})[0][1]) == 1
    node_a.xadd(tunnel_protocol.tunnel_output_stream("node-a", CONN), {"m": "x"}, maxlen=4096, approximate=True)
    forbidden = {
        "XREAD node-b's tunnel input": lambda: node_a.xread({tunnel_protocol.tunnel_input_stream("node-b"): "0"}),
        "XADD to its own tunnel input": lambda: node_a.xadd(tunnel_protocol.tunnel_input_stream("node-a"), {"m": "x"}),
        "XADD to node-b's tunnel input": lambda: node_a.xadd(tunnel_protocol.tunnel_input_stream("node-b"),
                                                             {"m": "x"}),
        "XTRIM its own tunnel input": lambda: node_a.xtrim(tunnel_protocol.tunnel_input_stream("node-a"), maxlen=0),
        "XADD node-b's answers": lambda: node_a.xadd(tunnel_protocol.tunnel_output_stream("node-b", CONN),
                                                     {"m": "x"}),
        "XRANGE its own answers back": lambda: node_a.xrange(tunnel_protocol.tunnel_output_stream("node-a", CONN)),
        "DEL its own answers": lambda: node_a.delete(tunnel_protocol.tunnel_output_stream("node-a", CONN)),
    }
    assert [what for what, call in forbidden.items() if not _refused(call)] == []
    assert redis_client.xlen(tunnel_protocol.tunnel_output_stream("node-a", CONN)) == 1
    assert redis_client.xlen(tunnel_protocol.tunnel_input_stream("node-b")) == 1
