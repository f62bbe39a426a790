"""Evaluation replay: how a pipeline's variants score against a reference and which to use.

`metrics` scores one variant's outputs per field (labels, numbers, free text) and puts
confidence intervals on the scores; `recommend` picks the cheapest variant that meets the
quality bar and says which variants a sample of this size cannot tell apart. Both are pure
functions over plain Python values; running the variants is the replay's job.
"""
