"""Sphinx extension: executes every notebook of ``notebooks/`` against the small run folders of
``docs/notebook_runs/`` (``scripts/make_notebook_runs.sh``: runs on the shipped tiny model) and writes each executed
notebook as a Markdown page with its outputs into ``docs/notebooks/`` before the build reads the sources. The outputs
the site shows are that execution's; a notebook that raises fails the build."""
from __future__ import annotations

import base64
import os
from pathlib import Path

#: notebook → (environment variable naming its run folder, folder under docs/notebook_runs)
NOTEBOOKS = {"sol_analysis": ("SOL_RUN_DIR", "sol"), "leaderboard": ("LEADERBOARD_RUN_DIR", "leaderboard"),
             "drafter_alignment": ("DRAFTER_RUN_DIR", "lora_ablation")}


def execute(path: Path, run_dir: Path, env: str, cwd: Path):
    """The notebook at ``path`` executed (nbclient, a real kernel) with ``env`` naming ``run_dir``."""
    import nbclient
    import nbformat

    old = os.environ.get(env)
    os.environ[env] = str(run_dir)
    try:
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        if old is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = old
    return nb


def to_markdown(nb, name: str, out: Path) -> str:
    """A MyST page of the executed notebook: markdown cells as they are, code in ``python`` blocks, text outputs in
    ``text`` blocks, Markdown outputs as they are, images as PNG files beside the page."""
    parts, n_img = [], 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
            continue
        if cell.cell_type != "code":
            continue
        parts.append(f"```python\n{cell.source}\n```")
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                raise RuntimeError(f"notebook {name} raised {o.ename}: {o.evalue}")
            if o.output_type == "stream":
                parts.append(f"```text\n{o.text.rstrip()}\n```")
                continue
            data = o.get("data", {})
            if "image/png" in data:
                n_img += 1
                img = out / f"{name}_{n_img}.png"
                img.write_bytes(base64.b64decode(data["image/png"]))
                parts.append(f"![output {n_img}]({img.name})")
            elif "text/markdown" in data:
                parts.append(data["text/markdown"])
            elif "text/plain" in data:
                parts.append(f"```text\n{data['text/plain'].rstrip()}\n```")
    return "\n\n".join(parts) + "\n"


def write_pages(app) -> None:
    src = Path(app.srcdir)
    root = src.parent
    out = src / "notebooks"
    out.mkdir(exist_ok=True)
    for name, (env, folder) in NOTEBOOKS.items():
        run = src / "notebook_runs" / folder
        nb = execute(root / "notebooks" / f"{name}.ipynb", run, env, out)
        page = to_markdown(nb, name, out)
        note = (f"*Executed when this site was built, on the run folder `docs/notebook_runs/{folder}` (made on the "
                f"shipped `tiny` model by `scripts/make_notebook_runs.sh`). The notebook: `notebooks/{name}.ipynb`.*")
        first, _, rest = page.partition("\n")
        (out / f"{name}.md").write_text(f"{first}\n\n{note}\n{rest}")


def setup(app):
    app.connect("builder-inited", write_pages)
    return {"parallel_read_safe": True, "version": "1"}
