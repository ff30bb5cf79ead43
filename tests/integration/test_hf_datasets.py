"""Training and evaluation from a local Hugging Face `datasets` folder with column mapping
(issue 16 acceptance 4), and the errors for a hub name offline, a missing split, a missing
column."""

import json

import pytest
from prereq import require

import traingym
from traingym.envs.datasets import DatasetError, load_rows
from traingym.envs.tasks import first_integer


def _save(tmp_path):
    datasets = require("datasets", "the `datasets` package (pip install 'traingym[datasets]')")

    def split(pairs):
        return datasets.Dataset.from_dict({
            "Frage text": [f"What is {a} + {b}?" for a, b in pairs],
            "gold": [a + b for a, b in pairs],
            "chat": [[{"role": "user", "content": f"Add {a} and {b}."},
                      {"role": "assistant", "content": str(a + b)}] for a, b in pairs],
            "source": ["synthetic"] * len(pairs)})
    pairs = [(a, b) for a in range(6) for b in range(6)]
    folder = tmp_path / "ds"
    datasets.DatasetDict({"training": split(pairs[:30]), "dev": split(pairs[30:])}).save_to_disk(
        str(folder))
    return folder


def test_train_and_eval_from_a_datasets_folder_with_column_mapping(tmp_path):
    folder = _save(tmp_path)
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "eval": {"num_prompts": 4},
        "task": {"dataset": str(folder), "split": "training", "eval_split": "dev",
                 "columns": {"prompt": "Frage text", "answer": "gold"},
                 "reward": "traingym.envs.tasks:exact_answer", "prefill": "",
                 "system_prompt": "Answer with a number."}})
    run = tmp_path / "run"
    result = traingym.train(cfg, run_dir=run, progress=False)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples
    train_prompts = {f"What is {a} + {b}?" for a in range(6) for b in range(6)}
    for s in samples:
        ex = s["example"]
        assert ex["prompt"] in train_prompts and "Frage text" not in ex and "gold" not in ex
        assert ex["source"] == "synthetic"  # unmapped columns are kept
        assert ex["prompt"] != "What is 5 + 0?"  # rows of the dev split are not trained on
        # the reward came from the mapped answer column
        assert s["reward"] == (1.0 if first_integer(s["completion"]) == ex["answer"] else 0.0)
    assert "Answer with a number." in samples[0]["prompt"]  # the system prompt, templated
    assert "after" in result.eval
    # evaluating the run reads the dev split through the same mapping
    res = traingym.evaluate(run)
    assert res.summary["num_prompts"] == 4
    assert {r["example"]["prompt"] for r in res.records} <= {
        f"What is 5 + {b}?" for b in range(6)}
    assert res.summary["overlap"]["overlapping_prompts"] == 0


def test_messages_column_and_mapping_errors(tmp_path):
    folder = _save(tmp_path)
    rows = load_rows(folder, {"messages": "chat"}, "dev")
    assert rows[0]["prompt"] == [{"role": "user", "content": "Add 5 and 0."}]
    assert rows[0]["answer"] == "5"  # the trailing assistant turn becomes the reference
    with pytest.raises(DatasetError, match=r"no split 'train'.*\['training', 'dev'\].*task.split"):
        load_rows(folder)
    with pytest.raises(DatasetError, match=r"no column\(s\) \['question'\].*'Frage text'"):
        load_rows(folder, {"prompt": "question"}, "dev")
    with pytest.raises(DatasetError, match="list of"):
        load_rows(folder, {"messages": "gold"}, "dev")
    with pytest.raises(traingym.ConfigError, match="did you mean 'answer'"):
        traingym.build_config("tiny", overrides={"task": {"columns": {"answr": "gold"}}})


def test_hub_name_offline_names_the_fix(tmp_path, monkeypatch):
    require("datasets", "the `datasets` package (pip install 'traingym[datasets]')")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # nothing cached
    with pytest.raises(DatasetError) as e:
        load_rows("hf:traingym-test/not-cached-anywhere")
    msg = str(e.value)
    assert "HF_HUB_OFFLINE" in msg and "save_to_disk" in msg and "task.dataset" in msg, msg
