"""Random search: replay the design space with fresh decisions, batch by batch, never twice the same program."""

from __future__ import annotations

from probtune._core import Rng
from probtune.space import Candidate, DesignSpace

__all__ = ["RandomSearch"]


class RandomSearch:
    """Draws batches of distinct, validated candidates from a design space.

    ``seen_decisions`` and ``seen_programs`` start from what the database
    already holds, so a resumed run does not measure anything again.
    """

    def __init__(
        self,
        space: DesignSpace,
        rng: Rng,
        *,
        seen_decisions: set[int] | None = None,
        seen_programs: set[int] | None = None,
        max_failed_draws: int = 256,
    ) -> None:
        self.space = space
        self.rng = rng
        self.seen_decisions = set(seen_decisions or ())
        self.seen_programs = set(seen_programs or ())
        self.max_failed_draws = max_failed_draws
        self.duplicates = 0

    def next_batch(self, size: int) -> list[Candidate]:
        """Up to ``size`` new candidates; fewer once ``max_failed_draws`` draws in a row give nothing new."""
        batch: list[Candidate] = []
        failed = 0
        while len(batch) < size and failed < self.max_failed_draws:
            candidate = self.space.sample(self.rng)
            if candidate is None:
                failed += 1
                continue
            if candidate.decision_hash in self.seen_decisions or candidate.program_hash in self.seen_programs:
                self.duplicates += 1
                failed += 1
                continue
            failed = 0
            self.seen_decisions.add(candidate.decision_hash)
            self.seen_programs.add(candidate.program_hash)
            batch.append(candidate)
        return batch
