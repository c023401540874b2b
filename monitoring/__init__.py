"""Nodes and GPUs: inventory from agent registrations, node liveness, (later) metric rollups.

Never imports ``jobs``: job state that follows node events is handled in ``jobs``, which reads
this app.
"""
