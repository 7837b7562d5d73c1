"""reid_engine: training and evaluation of person and vehicle re-identification models."""
__version__ = "0.1.0"
