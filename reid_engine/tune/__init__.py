"""Hyperparameter search on Optuna (`reid-tune`), above the engine and below the command line; Optuna
is imported on first use."""
