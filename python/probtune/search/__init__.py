"""Search: which candidates of a design space to measure next (``search_strategy``, the registered
kinds in ``strategies``), the kernel's mutators (``mutators``), and realizing candidates on every
core (``realize``).
"""
