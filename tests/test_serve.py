"""The service layer (serve/) stands without Gradio: the page and the Gradio API are built on it,
and other front ends can call it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow  # a fresh interpreter


def test_the_service_layer_imports_no_gradio():
    """In a fresh interpreter, every module of serve/ loads and Gradio stays unloaded."""
    modules = sorted(f"serve.{path.stem}" for path in (REPO / "serve").glob("*.py") if path.stem != "__init__")
    assert {"serve.running", "serve.model_host", "serve.outcome", "serve.messages"} <= set(modules)
    code = f"import sys, {', '.join(modules)}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'gradio'))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
