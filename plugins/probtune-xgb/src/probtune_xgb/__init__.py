"""Cost models for probtune: ``xgb`` (XGBoost learning to rank on program features) and ``random``."""

from __future__ import annotations

from typing import Any, Callable

from probtune import hookimpl

from probtune_xgb.model import RandomCostModel, XGBCostModel

__all__ = ["XGBCostModel", "RandomCostModel"]


@hookimpl
def probtune_register_cost_models(register: Callable[[str, Any], None]) -> None:
    register("xgb", XGBCostModel)
    register("random", RandomCostModel)
