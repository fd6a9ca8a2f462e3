"""Evaluation harness: code-continuation prompts, metrics, and policy sweeps written as Parquet."""
