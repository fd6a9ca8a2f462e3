"""Run every benchmark in this folder (or those named), one after the other, and print their JSON lines.

    python benchmarks/run_all.py                                   # every bench_*.py
    python benchmarks/run_all.py --only bench_family_forward --args=--quick
    python benchmarks/run_all.py --results_table benchmarks/results.jsonl

With ``--results_table`` every numeric field of every JSON line a benchmark prints is appended to the results table
(:mod:`workbench.results`) as one figure, keyed by the script, the line's identifying (non-numeric) fields and the
field's name, with the command that measured it.
"""
import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
sys.path.insert(0, str(here.parent))


def figures_of(script: str, command: str, line: dict) -> list[dict]:
    """The figures of one JSON line printed by ``script``: one per measured (float) field. Strings and integers
    are the line's setting (benchmark, family, batch, lengths), which names the figures; booleans, ``None``, lists
    and dicts are left out."""
    ident = ",".join(f"{k}={v}" for k, v in sorted(line.items())
                     if isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)))
    return [{"key": f"bench/{script}/{ident}/{k}", "metric": k, "value": v, "unit": None, "target": None,
             "model": line.get("model"), "adapter": None, "command": command, "setting": ident}
            for k, v in line.items() if isinstance(v, float)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="benchmark names (bench_x or bench_x.py) to run")
    ap.add_argument("--args", default="", help="arguments passed to every benchmark (e.g. --args=--quick)")
    ap.add_argument("--results_table", default=None, help="append the figures to this results table (JSON lines)")
    a = ap.parse_args(argv)
    scripts = sorted(here.glob("bench_*.py"))
    if a.only:
        want = {n.removesuffix(".py") for n in a.only}
        unknown = want - {s.stem for s in scripts}
        if unknown:
            ap.error(f"unknown benchmark {sorted(unknown)[0]}; valid: {', '.join(s.stem for s in scripts)}")
        scripts = [s for s in scripts if s.stem in want]
    figures = []
    for script in scripts:
        print(f"# {script.name}", flush=True)
        extra = shlex.split(a.args)
        command = " ".join(["python", f"benchmarks/{script.name}", *extra])
        proc = subprocess.Popen([sys.executable, str(script), *extra], stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("{"):
                try:
                    figures += figures_of(script.stem, command, json.loads(line))
                except json.JSONDecodeError:
                    pass
        proc.wait()
    if a.results_table and figures:
        from workbench.results import append_results

        print(f"# {append_results(figures, a.results_table)} figures appended to {a.results_table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
