"""The documentation works: the site builds with `mkdocs build --strict` (no broken link or
anchor, no warning from the API reference or the config-table hook; mkdocs.yml), README.md
stays a front door whose links resolve, and README's Python example runs (on the tiny preset,
2 steps, in a temporary folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from prereq import require

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_the_site_builds_strictly(tmp_path):
    require("mkdocs", "the docs build needs mkdocs (pip install -e '.[docs]')")
    require("material", "the docs build needs mkdocs-material (pip install -e '.[docs]')")
    require("mkdocstrings_handlers.python",
            "the docs build needs mkdocstrings-python (pip install -e '.[docs]')")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    # the pages the nav promises, the included BENCHMARKS.md and the generated reference
    assert (site / "benchmarks/index.html").read_text().count("<h2") >= 3
    config_page = (site / "reference/config/index.html").read_text()
    assert "trainer.lr" in config_page and "rollout.engine" in config_page
    assert 'id="traingym.api.train"' in (site / "reference/training/index.html").read_text()


def test_the_readme_is_a_front_door_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "README links into docs/"
    broken = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert broken == []


def readme_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.DOTALL | re.MULTILINE)
    assert len(blocks) == 1, "README has one Python example"
    return blocks[0]


def test_the_readme_example_runs(tmp_path, monkeypatch, capsys):
    """The example as written, with build_config made to start from the tiny preset and run 2
    short steps (the embedded model's 20 steps would take minutes)."""
    import traingym
    from traingym.config.load import build_config

    def tiny(preset="default", file=None, overrides=None):
        over = {**(overrides or {}), "steps": 2,
                "eval": {"num_prompts": 8, "samples_per_prompt": 2}}
        return build_config("tiny", file, over)

    monkeypatch.setattr(traingym, "build_config", tiny, raising=False)
    monkeypatch.chdir(tmp_path)
    code = compile(readme_example(), "README.md", "exec")
    exec(code, {"__name__": "readme_example"})  # noqa: S102 (the README's own example)
    out = capsys.readouterr().out
    runs = list(tmp_path.rglob("results.json"))
    assert len(runs) == 1, out
    assert "finished" in out.splitlines()[-1]
