"""Operations on whole buffers: checkpoints (writing, checking, restoring), retiring a
buffer from outside its owner (``gc``, ``rm``), and compiling every kernel once per
machine (``warmup``).
"""
