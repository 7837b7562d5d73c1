"""Hyperparameter search on Optuna (`reid-tune`): ``space`` (the search-space file), ``study`` (storage
and workers), ``trial_run`` (a trial = a training run), ``reporting`` (evaluations to the trial, pruning),
``results`` (table, plots, best config), ``tracking`` (the study in MLflow). Optuna is imported on first
use; layering: above engine, below the command line."""
