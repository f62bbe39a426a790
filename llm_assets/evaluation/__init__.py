"""Evaluation: replaying a sample of a pipeline's past days through variants of its spec."""
