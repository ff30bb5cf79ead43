"""Bad input fails early, names the problem, and loses nothing."""

import json
import resource
import subprocess
import sys

import pytest

import traingym
from traingym.envs.datasets import DatasetError
from traingym.envs.single_turn import RewardError


def _tiny(**over):
    return traingym.build_config("tiny", overrides={"steps": 2, "eval": {"num_prompts": 4}, **over})


def test_row_missing_field_fails_before_work_and_names_row(tmp_path):
    rows = [{"prompt": "a", "answer": 1}, {"question": "b"}]
    with pytest.raises(DatasetError, match="row 1 is missing field"):
        traingym.train(_tiny(), dataset=rows, reward=lambda s: 0.0, run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists(), "no run directory before the input is valid"


def test_jsonl_dataset_and_bad_json_line(tmp_path):
    good = tmp_path / "d.jsonl"
    good.write_text("\n".join(json.dumps({"prompt": f"p{i}", "answer": i}) for i in range(8)))
    result = traingym.train(_tiny(), dataset=str(good), eval_dataset=str(good),
                            reward=lambda s: float(len(s.completion_text) % 2), run_dir=tmp_path / "r",
                            progress=False)
    assert result.final_metrics["step"] == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{oops\n')
    with pytest.raises(DatasetError, match="bad.jsonl:2"):
        traingym.train(_tiny(), dataset=str(bad), reward=lambda s: 0.0, run_dir=tmp_path / "r2")


def test_reward_that_raises_stops_the_run_with_the_sample(tmp_path):
    def reward(sample):
        raise KeyError("no such field")

    with pytest.raises(RewardError) as e:
        traingym.train(_tiny(), reward=reward, run_dir=tmp_path / "r", progress=False)
    assert "KeyError" in str(e.value) and "completion:" in str(e.value)
    assert e.value.sample.prompt_ids, "the offending sample travels with the error"


def test_reward_returning_non_number_is_an_error(tmp_path):
    with pytest.raises(RewardError, match="finite float"):
        traingym.train(_tiny(), reward=lambda s: None, run_dir=tmp_path / "r", progress=False)


def test_run_dir_holding_a_run_is_never_overwritten(tmp_path):
    traingym.train(_tiny(), run_dir=tmp_path / "r", progress=False)
    before = (tmp_path / "r" / "events.jsonl").read_text()
    with pytest.raises(FileExistsError, match="--resume"):
        traingym.train(_tiny(), run_dir=tmp_path / "r", progress=False)
    with pytest.raises(FileExistsError, match="different config"):
        traingym.train(_tiny(seed=5), run_dir=tmp_path / "r", resume=True, progress=False)
    assert (tmp_path / "r" / "events.jsonl").read_text() == before


def test_cli_unknown_key_fails_fast_suggesting_the_closest(tmp_path):
    # "Fast" is counted in the child's CPU seconds, not wall time (which a loaded CI machine
    # stretches): the imports cost ~3-4 s of CPU, loading the model and an engine several more.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "traingym.cli", "train", "--set", "trainer.lrr=1",
                        "--run-dir", str(tmp_path / "r")], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert p.returncode == 2
    assert "unknown key 'trainer.lrr'; did you mean 'trainer.lr'?" in p.stderr
    assert cpu_s < 10 and not (tmp_path / "r").exists()
