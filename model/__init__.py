"""The Pre-LN GPT-2 model and everything that runs it. No UI code, no task code."""
from .checkpoint import load_pretrained, save_pretrained
from .config import GPT2Config
from .gpt2 import GPT2

__all__ = ["GPT2", "GPT2Config", "load_pretrained", "save_pretrained"]
