import pytest

from tests.factories import GpuFactory, NodeFactory


@pytest.fixture
def node_n1(db):
    """A registered node ``n1`` with two GPUs (index 0 and 1)."""
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0, uuid="GPU-n1-0")
    GpuFactory(node=node, index=1, uuid="GPU-n1-1")
    return node
