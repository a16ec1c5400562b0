"""Cost models for probtune: ``xgb`` (XGBoost learning to rank on program features) and ``random``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probtune.plugin import hookimpl
from probtune_xgb.model import RandomCostModel, XGBCostModel

__all__ = ["RandomCostModel", "XGBCostModel"]


@hookimpl
def probtune_register_cost_models(register: Callable[[str, Any], None]) -> None:
    register("xgb", XGBCostModel)
    register("random", RandomCostModel)
