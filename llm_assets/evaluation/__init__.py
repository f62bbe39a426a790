"""Evaluation replay: variants of a pipeline scored on a sample of its history.

`spec` holds the spec's `variants:` and `eval:` sections and a variant's merged spec;
`promote` makes a variant the baseline; `sample` draws a seeded sample of a pipeline's days
and `replay` runs it through the baseline and its variants as eval pipelines of their own;
`metrics` scores a variant's outputs per field (labels, numbers, free text) with confidence
intervals; `recommend` picks the cheapest variant that meets the quality bar and says which
variants a sample of this size cannot tell apart.
"""
