"""Node states and alert kinds."""

from django.db import models


class NodeHealth(models.TextChoices):
    UP = "UP", "Up"
    LOST = "LOST", "Lost"  # heartbeat expired and stayed so past COLONY_NODE_LOST_GRACE_S; its jobs were requeued


class AlertKind(models.TextChoices):
    IDLE_GPU = "idle_gpu", "Idle GPU"
    XID = "xid", "XID error"
    THERMAL = "thermal", "Temperature over threshold"
    MEMORY_OVER_REQUEST = "memory_over_request", "Job over its memory request"
    NODE_LOST = "node_lost", "Node lost"


class Resolution(models.IntegerChoices):
    TEN_SECONDS = 10, "10 s"
    ONE_MINUTE = 60, "1 min"
