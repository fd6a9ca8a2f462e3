"""Run every benchmark in this folder, one after the other, and print their JSON lines."""
import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
for script in sorted(here.glob("bench_*.py")):
    print(f"# {script.name}", flush=True)
    subprocess.run([sys.executable, str(script)], check=False)
