"""The pieces of ``shmreplay.ray``: the buffer-side actor (``service``), the remote
client (``remote``) and its writers (``writers``). Import ``shmreplay.ray``."""
