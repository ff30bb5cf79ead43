"""The console display (observability/progress.py): one plain line per step off a terminal, a
rich progress bar on one; step, reward, tokens/s, staleness (async) and ETA in both."""

import io
import sys

from traingym.observability.progress import Progress

STEP = {"reward_mean": 0.5, "loss": 0.01, "groups_kept": 3, "groups": 4,
        "gen_tokens_per_s": 120.0, "seconds_step": 2.0}
ASYNC = {**STEP, "async_staleness_mean": 0.5, "async_staleness_max": 1}


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_off_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    p = Progress(total_steps=4, start_step=1)
    assert p.bar is None
    p.update(1, STEP)
    p.update(2, ASYNC)
    p.message("held-out reward ...")
    p.close()
    lines = sys.stdout.getvalue().splitlines()
    assert lines[0].startswith("step 2/4  reward 0.500  loss +0.0100  kept 3/4  gen 120 tok/s  "
                               "2.0 s/step  ETA ")
    assert "stale" not in lines[0]  # sync: no staleness
    assert "stale 0.5/1" in lines[1] and lines[1].startswith("step 3/4")
    assert lines[2] == "held-out reward ..."


def test_rich_bar_on_a_terminal(monkeypatch):
    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", "160")
    p = Progress(total_steps=3)
    assert p.bar is not None
    p.update(0, ASYNC)
    p.update(1, ASYNC)
    p.bar.refresh()
    p.close()
    text = out.getvalue()
    assert "2/3" in text and "stale 0.5/1" in text and "120 tok/s" in text and "ETA" in text


def test_disabled_prints_nothing(monkeypatch):
    monkeypatch.setattr(sys, "stdout", Terminal())
    p = Progress(total_steps=2, enabled=False)
    p.update(0, STEP)
    p.message("x")
    p.close()
    assert sys.stdout.getvalue() == ""
