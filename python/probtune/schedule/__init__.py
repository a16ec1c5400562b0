"""The schedule language: a probabilistic program of TVM schedule instructions (``schedule``), and the
read-only TIR analysis that design-space modules and validators share (``analysis``).
"""
