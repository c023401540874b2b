"""The REST API's project-wide pieces: the error format (``errors``), the body parsers
(``parsers``), the submission throttle (``throttles``) and the /api/v1/ root (``urls``).

The apps' API modules import these; so apart from ``urls`` (the root, which includes the apps'
routes) nothing here imports ``jobs`` or ``monitoring``.
"""
