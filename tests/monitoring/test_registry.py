"""Agent registrations keep the Node/Gpu inventory true to what the node has."""

from agents.protocol import GpuInfo, NodeRegistered
from monitoring.models import Gpu, Node
from monitoring.services.registry import cluster_inventory, register_node


def registration(node="n1", gpus=4, model="A100-80GB", memory=81920, uuid_prefix="GPU-a"):
    return NodeRegistered(
        node=node, backend="simulated", agent_version="0.1.0", hostname="host",
        gpus=[GpuInfo(index=i, uuid=f"{uuid_prefix}{i}", model=model, memory_mib=memory) for i in range(gpus)],
    )


def test_reregistering_is_idempotent(db):
    register_node(registration())
    register_node(registration())
    assert Node.objects.count() == 1
    assert Gpu.objects.filter(present=True).count() == 4


def test_swapped_gpu_replaces_the_old_one_which_is_kept_absent(db):
    register_node(registration(uuid_prefix="GPU-old-"))
    register_node(registration(uuid_prefix="GPU-new-"))
    assert set(Gpu.objects.filter(present=True).values_list("uuid", flat=True)) == {f"GPU-new-{i}" for i in range(4)}
    assert Gpu.objects.filter(present=False).count() == 4


def test_inventory_reflects_present_gpus(db):
    assert cluster_inventory().total_gpus == 0
    register_node(registration("a", gpus=8, memory=32768, model="V100-32GB"))
    register_node(registration("b", gpus=4, memory=81920, uuid_prefix="GPU-b"))
    inventory = cluster_inventory()
    assert (inventory.total_gpus, inventory.most_gpus_on_a_node, inventory.largest_gpu_mib) == (12, 8, 81920)
    assert inventory.widest_nodes(1) == 8 and inventory.widest_nodes(2) == 12
    assert inventory.models == {"V100-32GB", "A100-80GB"}
