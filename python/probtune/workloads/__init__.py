"""What probtune tunes: a workload, one TIR PrimFunc with what checks and rates it (``workload``), and
the built-in operators (``catalog``).
"""
