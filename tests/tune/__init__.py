"""Tests of the hyperparameter search (reid-tune)."""
