"""Tenants, jobs and allocations; submission, queue views and the scheduling loop.

``jobs.scheduling`` is the pure scheduler core and must stay importable without Django, so this
package's ``__init__`` imports nothing.
"""
