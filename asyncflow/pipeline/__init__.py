"""The engine: specs, the fluent Pipeline, runs on their own loop thread, channels, stats."""

from ._handle import Run
from ._pipeline import Pipeline
from ._spec import CustomSpec
from ._stats import FailureRecord, PipelineStats, StageStats

__all__ = ["CustomSpec", "FailureRecord", "Pipeline", "PipelineStats", "Run", "StageStats"]
