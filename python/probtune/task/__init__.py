"""Tuning tasks and the one tuning loop: a task (``task``), its search session (``session``), the task
scheduler that gives out trials (``task_scheduler``), the loop (``driver``) and tuning one operator
(``tuning``).
"""
