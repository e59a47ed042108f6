"""What the ``Client`` facade (``shmreplay.client``) is made of: the addresses it
accepts, its lazy connection, calls retried after a layout reset, and ``insert``'s
general path.
"""
