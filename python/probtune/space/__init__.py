"""Design spaces: the probabilistic program of one workload and target, its points and their programs
(``design_space``, which reads no registry), the generator that has the registered space modules build
it (``space_generator``), and the unrolling choice every target's space makes (``unroll``).
"""
