"""Multi-row INSERTs of plain tuples, without a model instance per row.

A first scheduling cycle inserts tens of thousands of allocation and timeline rows; through
``bulk_create`` most of its Python time went into building model instances and preparing each
value of each row. On PostgreSQL the rows travel instead as one array per column, unnested by the
server: one statement, a handful of parameters, each array sent as the text of an array literal
(psycopg would dump a Python list element by element, in Python: a fifth of a first cycle's apply).
Elsewhere (SQLite) it is ``bulk_create``. Values must be what the column stores (ints, floats,
bools, strings, aware datetimes, None): no field's ``get_db_prep_value`` runs, so use this only
for columns of such plain types.

``ids_in(ids)`` is the same idea for ``pk__in`` over thousands of ids: one parameter, not one
placeholder each for psycopg to find in the SQL and adapt.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import connection
from django.db.models.expressions import RawSQL

BATCH_ROWS = 2000
# Below this many ids a plain IN list is as cheap.
IDS_AS_ONE_PARAMETER = 100


def ids_in(ids: Iterable[int]):
    """What ``field__in=`` should be given for these (integer) ids."""
    ids = list(ids)
    if connection.vendor != "postgresql" or len(ids) < IDS_AS_ONE_PARAMETER:
        return ids
    return RawSQL("SELECT unnest(string_to_array(%s, ',')::bigint[])", [",".join(map(str, ids))])


def array_literal(values: Iterable) -> str:
    """PostgreSQL's text form of a one-dimensional array of these values."""
    return "{" + ",".join(map(_element, values)) + "}"


def _element(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(int(value))  # (an IntEnum's own str is its name)
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime: insert_rows stores aware datetimes only")
        return '"' + value.isoformat() + '"'
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError("insert_rows takes ints, floats, bools, strings, aware datetimes and None, "
                    f"not {type(value).__name__}")


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
    # A foreign key's type is its target's. Text travels as text[]: a cast to varchar(n) would cut
    # what is too long without a word, where storing it into the column refuses it.
    arrays = ", ".join(f"%s::{_array_type(field)}[]" for field in fields)
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({targets}) SELECT * FROM unnest({arrays})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [array_literal(values) for values in zip(*rows)])


def _array_type(field) -> str:
    db_type = field.db_type(connection)
    return "text" if db_type.startswith("varchar") else db_type
