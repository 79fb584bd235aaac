"""The Pre-LN GPT-2 network and its files: config, checkpoints, tokenizers, adapters. What runs it
fast lives in engine/, training in train/; this package imports neither."""
from .checkpoint import load_pretrained, save_pretrained
from .config import GPT2Config
from .gpt2 import GPT2

__all__ = ["GPT2", "GPT2Config", "load_pretrained", "save_pretrained"]
