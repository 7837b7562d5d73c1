"""Integrations with outside services and file formats that the engine sees only as event writers
(MLflow, tensorboard, ...)."""
