"""The tuning database: workloads and every measured candidate in one SQLite file (``database``), and
the key records are kept under (``measure_key``).
"""
