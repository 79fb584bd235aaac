"""Benchmarks: measured, printed and compared with transformers in one process (see bench/decode.py)."""
