"""GPU backends: where the agent learns what GPUs its node has (and, later, how busy they are).

``base`` holds the interface, ``nvml`` the real one (pynvml), ``simulated`` a stand-in for
machines without GPUs (development, tests, trace replays). Backends never touch Redis.
"""
