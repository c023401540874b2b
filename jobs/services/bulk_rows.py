"""Multi-row INSERTs of plain tuples, without a model instance per row.

A first scheduling cycle inserts tens of thousands of allocation and timeline rows; through
``bulk_create`` most of its Python time went into building model instances and preparing each
value of each row. On PostgreSQL the rows travel instead as one array per column, unnested by the
server: one statement, a handful of parameters. Elsewhere (SQLite) it is ``bulk_create``.
Values must be what the column stores (ints, strings, aware datetimes, None): no field's
``get_db_prep_value`` runs, so use this only for columns of such plain types.
"""

from __future__ import annotations

from django.db import connection

BATCH_ROWS = 2000


def insert_rows(model, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """Insert ``rows`` (tuples in the order of ``columns``, field names or attnames) into ``model``'s table."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create([model(**dict(zip(columns, row))) for row in rows], batch_size=BATCH_ROWS)
        return
    fields = [model._meta.get_field(column) for column in columns]
    quote = connection.ops.quote_name
    targets = ", ".join(quote(field.column) for field in fields)
    arrays = ", ".join(f"%s::{field.db_type(connection)}[]" for field in fields)  # a foreign key's: its target's
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({targets}) SELECT * FROM unnest({arrays})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(values) for values in zip(*rows)])
