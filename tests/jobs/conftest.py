import pytest

from tests.factories import GpuFactory, NodeFactory


@pytest.fixture
def inventory(db):
    """One node with 8 x 80 GiB GPUs and one with 4 x 32 GiB."""
    big, small = NodeFactory(name="big"), NodeFactory(name="small")
    gpus = [GpuFactory(node=big, index=i) for i in range(8)]
    gpus += [GpuFactory(node=small, index=i, model="V100-32GB", memory_mib=32768) for i in range(4)]
    return gpus
