"""Hyperparameter search on Optuna (`reid-tune`): each trial is one ordinary training run.

- ``space``: the search-space YAML file (load, check against the base config, suggest values);
- ``study``: the study's storage, its trial slots, heartbeats and the continuation of
  interrupted trials, and the loop every worker runs (``work_on_study``);
- ``trial_run``: one trial = the base command trained with the trial's values, in its own folder;
- ``reporting``: the hook that reports each evaluation to the trial and stops a pruned run;
- ``results``: the table of the best trials, the plots and the best trial's config.

Optuna and SQLAlchemy are an optional extra (``pip install 'reid_engine[tune]'``): nothing here
imports them before a search needs them. Layering: above engine, below the command line
(``reid_engine.cli.tune``), which hands reid-train's worker function in.
"""
