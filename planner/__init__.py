"""planner: heterogeneity-aware placement optimizer for distributed training."""

__version__ = "0.1.0"
