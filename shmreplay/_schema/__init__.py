"""What a table's items look like: checking inputs against a table's layout, Reverb's
per-item forms, the insert fast path's leaves, and the storage a first item defines.

Used by the engine, the writers and the client; uses only the shared-memory layer.
"""
