"""How many rows the ledger handles per statement. Read at each call (`limits.CHUNK`), so
tests can make every chunked loop work in small chunks."""

CHUNK = 5_000
"""Rows per query of a read or a keyed update."""
BULK_CHUNK = 50_000
"""Rows per COPY / executemany: large enough that per-statement costs vanish."""
HASH_JOIN_ROWS = 1_000
"""Fewer staged rows of a shard than this are matched by the unique index: reading all of a
large shard's rows would cost more than their descents."""
