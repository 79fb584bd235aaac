"""Start-up time: a fresh clone's `python app.py`, from launch to its first `/generate` answer.

    python -m bench.startup [--source DIR] [--keep-build-cache]

Clones the checkout at --source (default: this one's HEAD) into a temporary folder and starts
its app.py on the bundled model with this interpreter, an empty decode-kernel build cache
(TORCH_EXTENSIONS_DIR) unless --keep-build-cache, on a free loopback port. Prints the seconds
from launch to the page answering, to the first /generate answer, and to the log line that says
the decode kernels are ready (they build in the background), then stops the app.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradio_client import Client

from bench.load import free_port, wait_for_app

REPO = Path(__file__).resolve().parent.parent
KERNELS_READY, KERNELS_UNAVAILABLE = "decode kernels ready", "decode kernels unavailable"  # engine/kernels.py's log


def seconds_to_first_answer(source: Path, keep_build_cache: bool, timeout_s: float = 300) -> dict[str, float | None]:
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "clone"
        subprocess.run(["git", "clone", "-q", str(source), str(clone)], check=True)
        env = {**os.environ, "STUDIO_DEVICE": "cpu"}
        if not keep_build_cache:
            env["TORCH_EXTENSIONS_DIR"] = str(Path(folder) / "empty-build-cache")
        port, log_path = free_port(), Path(folder) / "app.log"
        url = f"http://127.0.0.1:{port}/"
        with log_path.open("w") as log:
            launched = time.perf_counter()
            process = subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
                                       cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_app(process, url, log_path, timeout_s=timeout_s)
            page_s = time.perf_counter() - launched
            _, status, _, _ = Client(url, verbose=False).predict("Once upon a time", max_new_tokens=16, seed=1,
                                                              api_name="/generate")
            answer_s = time.perf_counter() - launched
            ready_s, unavailable = None, False
            while ready_s is None and not unavailable and process.poll() is None \
                    and time.perf_counter() - launched < timeout_s:
                log = log_path.read_text()
                if KERNELS_READY in log:
                    ready_s = time.perf_counter() - launched
                unavailable = KERNELS_UNAVAILABLE in log
                time.sleep(0.2)
        finally:
            process.terminate()
            process.wait(30)
        return {"page_s": page_s, "first_generate_s": answer_s, "kernels_ready_s": ready_s,
                "kernels_unavailable": unavailable, "status": status}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=REPO, help="the git checkout to clone (default: this one)")
    p.add_argument("--keep-build-cache", action="store_true",
                   help="use the usual build cache rather than an empty one")
    args = p.parse_args(argv)
    n = seconds_to_first_answer(args.source, args.keep_build_cache)
    ready = ("unavailable (see the app's log)" if n["kernels_unavailable"] else "-" if n["kernels_ready_s"] is None
             else f"{n['kernels_ready_s']:.1f}")
    print(f"build cache: {'kept' if args.keep_build_cache else 'empty'}")
    print("| from launch to | seconds |\n|---|---:|")
    print(f"| the page answering | {n['page_s']:.1f} |")
    print(f"| the first /generate answer | {n['first_generate_s']:.1f} |")
    print(f"| the decode kernels ready (background build) | {ready} |")
    print(f"first answer's status: {n['status']}")


if __name__ == "__main__":
    main()
