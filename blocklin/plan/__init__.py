"""Pure planning functions: (shapes, dtype, chunks, budgets) -> frozen plans. No I/O."""

from blocklin.plan.chunks import auto_chunks, panel_rows, split
from blocklin.plan.gemm import GemmPlan, plan_gemm

__all__ = ["GemmPlan", "auto_chunks", "panel_rows", "plan_gemm", "split"]
