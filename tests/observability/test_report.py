"""`traingym report`: on a real tiny run (held-out eval before and after, a `<script>` in its
prompts) it writes real PNG charts and a self-contained HTML page with every text escaped."""

import html
import re
import struct

import pytest
from prereq import require

import traingym
from traingym import cli
from traingym.envs.tasks import digit_fraction
from traingym.dashboard.report import CHARTS

XSS = "<script>alert('x')</script>"
ROWS = [{"prompt": f"What is {a} + 1? {XSS}", "answer": a + 1} for a in range(12)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "run"
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "threads": 1, "eval": {"num_prompts": 4, "samples_per_prompt": 1}})
    traingym.train(cfg, dataset=ROWS, eval_dataset=ROWS[:4], reward=digit_fraction,
                   run_dir=path, progress=False)
    return path


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_report_writes_charts_and_an_escaped_self_contained_page(run_dir, tmp_path, capsys):
    require("matplotlib", "traingym report needs the report extra (matplotlib)")
    out = tmp_path / "out"
    assert cli.main(["report", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out / 'report.html'}"
    pngs = sorted(p.stem for p in out.glob("*.png"))
    assert pngs == sorted(set(CHARTS) - {"staleness"})  # a sync run has no staleness
    for name in pngs:
        w, h = _png_size((out / f"{name}.png").read_bytes())
        assert (w, h) == (640, 340), name
    from PIL import Image

    with Image.open(out / "reward.png") as im:
        im.load()
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is not None and len(colours) > 10  # drawn, not blank

    page = (out / "report.html").read_text()
    assert "<script" not in page.lower()  # neither the run's text nor the page itself
    assert html.escape(XSS) in page  # the prompt is shown, as text
    assert page.count('src="data:image/png;base64,') == len(pngs)
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from anywhere
    assert "Held-out reward" in page and "before" in page and "after" in page
    assert re.search(r"sampled</td><td>[0-9.]+ ± [0-9.]+ \(n=4\)</td><td>[0-9.]+ ±", page)
    assert "<td>model.path</td><td>tiny</td>" in page


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("traingym: ") and "holds no events.jsonl" in err
