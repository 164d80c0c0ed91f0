"""Cuvil: a Python-native compiler for PyTorch inference."""
