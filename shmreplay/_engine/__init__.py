"""One table's engine (``table_engine.TableEngine``) and the buffer holding the tables.

The engine delegates inserting (``inserts``), sampling (``sampling``), waiting
(``waits``) and reporting (``table_info``), and what differs between storage kinds
to ``kinds/`` (whole items, step references); ``data_segment`` maps a table's stores,
``snapshot`` copies its live items out for checkpoints, and ``staging``, ``outputs``
and ``batch_outputs`` are the process-local memory of the hot paths.
"""
