"""The defaults of a tuning run, defined once for the Python API, the CLI and the benchmarks.

Nothing is imported here, so that the CLI can read them before TVM loads.
"""

from __future__ import annotations

__all__ = [
    "BATCH_SIZE", "BUILD_TIMEOUT", "BUNDLE_REFERENCE_MB", "CONFIRM", "CONFIRM_SHARE", "COST_MODEL", "FIRST_ROUNDS_SHARE",
    "LOCAL", "MAX_PRODUCT_POWER", "MODEL_CACHE_FLUSH", "MODEL_ROUND_CANDIDATES", "MODEL_TRIALS", "OPERATOR_TRIALS",
    "PRECISIONS", "RUN_TIMEOUT", "SCHEDULER", "TARGET_PRECISIONS",
]

OPERATOR_TRIALS = 64
"""New measurements of one operator (``tune``)."""

MODEL_TRIALS = 1000
"""New measurements over all the tasks of a model (``tune_model``)."""

BATCH_SIZE = 16
"""Candidates measured per search round.

Rounds of 16 with one generation each cost the search time per trial of
rounds of 32 with two, and the cost model learns twice as often."""

FIRST_ROUNDS_SHARE = 0.5
"""At most this part of a model's budget goes to its tasks' first rounds; the task scheduler gives out the rest.

With a round of ``BATCH_SIZE`` for each of many tasks, the first rounds would take nearly all of the budget,
and the few tasks that hold most of the time would get no more trials than the many that hold little."""

CONFIRM = 4
"""Best records of a task timed again at the end of a run, so that one lucky timing does not decide."""

CONFIRM_SHARE = 0.01
"""A model's task is confirmed (``CONFIRM``) only where it is at least this part of the model's estimated latency."""

BUILD_TIMEOUT = 60.0
"""Seconds one candidate may take to compile."""

RUN_TIMEOUT = 10.0
"""Seconds one candidate may take to load, check and time."""

MODEL_CACHE_FLUSH = True
"""A model's tasks are timed with their weights and outputs flushed from the caches, as a model larger than the
last-level cache runs them, where the cache cannot be read (another runner's machine; :mod:`probtune.model.cache_mode`).

Timed warm, such a model's tasks leave out what reading their weights costs once
other layers have run, and the estimated model time falls short of the real one."""

LOCAL = "local"
"""The registered name of the builder and the runner that measure on this machine: a target's default."""

SCHEDULER = "gradient"
"""The task scheduler of a model's run."""

COST_MODEL = "xgb"
"""The registered cost model that guides the evolutionary search (the probtune-xgb plugin's)."""

BUNDLE_REFERENCE_MB = 16.0
"""The largest reference (inputs and outputs, MB) a measurement bundle carries whole.

A larger one travels as its inputs' seed and its outputs at sampled positions."""

PRECISIONS = ("fp32", "fp16", "bf16")
"""What a model can be compiled in (:mod:`probtune.model.precision`): as its file has it, or its products converted
to float16 or bfloat16."""

TARGET_PRECISIONS = ("fp32", "fp16")
"""The precisions a target offers unless its plugin says otherwise (``TargetSpec.precisions``): bf16 needs a target
whose products run in it (a CPU with bf16 dot products)."""

MODEL_ROUND_CANDIDATES = 16
"""New candidates of each task in one round of a model tuned through bundles (:mod:`probtune.model.rounds`)."""

THREAD_CHOICE_ROUNDS = 5
"""Rounds in which a compiled model is timed at each thread count it may run on (:mod:`probtune.model.thread_count`)."""

MAX_PRODUCT_POWER = 4
"""The largest constant exponent a power is computed with as products of its base (``x ** 3`` of a tanh-GELU), where
TVM calls libm's ``pow`` once per element; beyond it, the products' rounding errors add up."""

THREAD_CHOICE_DROP = 1.5
"""A thread count timed this many times slower than the fastest in a round is timed no further
(:mod:`probtune.model.thread_count`): the noise of a shared machine is a few percent, never this much."""

THREAD_CHOICE_MARGIN = 0.03
"""How much faster (median over the rounds) fewer threads must run a compiled model than the target's cores to be
chosen: a smaller gain is within the noise of a shared machine, and all cores are what its tasks were tuned on."""
