"""Cuvil runtime: target registry, executor, compile cache, reference target."""
