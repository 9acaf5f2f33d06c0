"""Click commands, one module per command group; the logic lives in ``planner.api``."""
