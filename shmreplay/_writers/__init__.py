"""What Reverb's two writers (``shmreplay.writer``, ``shmreplay.trajectory_writer``)
are made of: the steps they keep (``history``), inserting an item over shared step rows
(``writing``), items waiting for a rate limiter (``pending``), and the trajectory
writer's short paths (``trajectory_shortcuts``).
"""
