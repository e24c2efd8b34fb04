"""`make bench`: every benchmark in one go (figures go to BENCHMARKS.md by hand). Pass --quick for a smoke run."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["shard_bench.py", "preprocess_vs_hf.py", "engine_vs_hf.py", "pretrain_tiny.py", "corpus_scale.py"]

if __name__ == "__main__":
    extra = sys.argv[1:]
    failed = []
    for name in SCRIPTS:
        print(f"\n===== {name} {' '.join(extra)}", flush=True)
        if subprocess.run([sys.executable, str(HERE / name), *extra]).returncode != 0:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
