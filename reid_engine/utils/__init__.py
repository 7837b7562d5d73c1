"""Utilities that know nothing about the layers above them."""
