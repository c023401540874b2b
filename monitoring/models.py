"""Inventory: what nodes and GPUs the cluster has, as their agents registered them."""

from django.db import models


class Node(models.Model):
    name = models.CharField(max_length=63, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    backend = models.CharField(max_length=32, blank=True, help_text="nvml or simulated")
    agent_version = models.CharField(max_length=32, blank=True)
    cordoned = models.BooleanField(default=False, help_text="Cordoned nodes get no new jobs.")
    registered_at = models.DateTimeField(help_text="Last time the agent (re)registered.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="Index on the node (CUDA_VISIBLE_DEVICES).")
    uuid = models.CharField(max_length=128, unique=True)
    model = models.CharField(max_length=64)
    memory_mib = models.PositiveIntegerField()
    # A GPU missing from the node's latest registration is kept (allocations point at it) but
    # never offered to the scheduler.
    present = models.BooleanField(default=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"], condition=models.Q(present=True), name="gpu_unique_present_index_per_node"
            )
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.model})"
