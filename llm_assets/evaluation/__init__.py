"""Evaluation replay: variants of a pipeline scored on a sample of its history."""
