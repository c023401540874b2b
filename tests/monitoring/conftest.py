import pytest

from tests.factories import GpuFactory, NodeFactory


@pytest.fixture
def node_n1(db):
    """A registered node ``n1`` with two GPUs (index 0 and 1)."""
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0, uuid="GPU-n1-0")
    GpuFactory(node=node, index=1, uuid="GPU-n1-1")
    return node


def place_job(job_id: int, node_name: str, gpu_index: int = 0):
    """Job ``job_id`` (created if needed) holding GPU ``gpu_index`` of ``node_name``: a node may
    report usage only for jobs placed on it."""
    from jobs.models import Allocation, Job
    from monitoring.models import Gpu
    from tests.factories import JobFactory

    job = Job.objects.filter(pk=job_id).first() or JobFactory(pk=job_id)
    Allocation.objects.create(job=job, gpu=Gpu.objects.get(node__name=node_name, index=gpu_index))
    return job
