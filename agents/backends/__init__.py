"""GPU backends: what GPUs a node has, how they are connected, and how busy they are.

``base`` holds the interface and the values it passes, ``nvml`` the real one (pynvml), ``simulated``
a stand-in for machines without GPUs (development, tests, demos) whose readings come from the
synthetic job profiles in ``workloads``; ``pids`` maps GPU processes to jobs. Backends never touch
Redis and never signal processes.
"""
