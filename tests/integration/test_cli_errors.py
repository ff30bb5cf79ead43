"""Every bad input to the CLI ends in one `traingym: ...` line and exit code 2, before any work.

Each case runs `traingym.cli.main` in-process (model loading is patched to fail the test, so a
case that slips past validation cannot start a run); a few run through a real subprocess to
show that no traceback reaches the terminal. A reward raising mid-run exits 1.
"""

import subprocess
import sys
from importlib.util import find_spec

import pytest

from traingym import cli

REWARDS = "tg_cli_errors_rewards"  # a user module on sys.path for the reward cases
FILES = {
    "bad.toml": "steps = \n",
    "typo.toml": "stpes = 3\n",
    "bad.yaml": "steps: [\n",
    "bad.json": "{bad",
    "list.json": "[1, 2]",
    "c.txt": "steps = 3",
    "ok.jsonl": '{"prompt": "a", "answer": 1}\n',
    "bad.jsonl": '{"prompt": "a", "answer": 1}\n{oops\n',
    "nofield.jsonl": '{"question": "a"}\n',
    "empty.jsonl": "",
    "afile": "x",
    "hasrun/config.json": '{"seed": 3, "trainer": {"lr": 0.5}}',
    "broken/config.json": '{"seed": 3, "trai',
    f"{REWARDS}.py": "X = 3\n\ndef ok(sample):\n    return 0.0\n",
    "tg_cli_errors_syntax.py": "def f(s)\n    return 1\n",
    "emptyds/readme.txt": "not a datasets folder",
}

R = ["--set", f"task.reward={REWARDS}:ok"]  # a valid reward for the dataset cases
CASES = [  # (id, argv with {d} for the case folder, fragment of the message)
    ("unknown subcommand", ["trian"], "invalid choice: 'trian'"),
    ("no subcommand", [], "required: command"),
    ("unknown flag", ["train", "--bogus"], "unrecognized arguments: --bogus"),
    ("--set without value", ["train", "--set"], "--set: expected one argument"),
    ("--set without =", ["train", "--set", "steps"], "expected key=value"),
    ("--set empty name", ["train", "--set", "trainer..lr=1"], "'trainer..lr' is not a key"),
    ("--set below a value", ["train", "--set", "trainer=1", "--set", "trainer.lr=2"],
     "gave 'trainer' the value 1"),
    ("unknown key", ["train", "--set", "step=3"], "unknown key 'step'; did you mean 'steps'?"),
    ("unknown nested key", ["train", "--set", "trainer.lrr=1"],
     "unknown key 'trainer.lrr'; did you mean 'trainer.lr'?"),
    ("key in the wrong section", ["train", "--set", "rollout.lr=1"], "did you mean 'trainer.lr'?"),
    ("unknown section", ["train", "--set", "rolout.group_size=2"],
     "unknown section 'rolout'; did you mean 'rollout'?"),
    ("unknown key, nothing close", ["train", "--set", "trainer.zzz=1"],
     "valid keys in 'trainer': betas"),
    ("bad type", ["train", "--set", "steps=abc"], "'steps': Input should be a valid integer"),
    ("out of range", ["train", "--set", "rollout.group_size=1"], "'rollout.group_size'"),
    ("bad choice", ["train", "--set", "mode=fast"], "'mode': Input should be 'sync' or 'async'"),
    ("cross-section", ["train", "--set", "mode=async"], "weights.transport must be"),
    ("section check", ["train", "--set", "cluster.address=h:1"], "apply only with"),
    ("unknown preset", ["train", "--preset", "tinny"], "did you mean 'tiny'?"),
    ("unknown task", ["train", "--set", "task.name=mult"], "unknown built-in task 'mult'"),
    ("misspelt task", ["train", "--set", "task.name=arth"], "did you mean 'arith'?"),
    ("unknown codec", ["train", "--set", "weights.codec=zstd"], "unknown codec 'zstd'"),
    ("misspelt codec", ["train", "--set", "weights.codec=detla"], "did you mean 'delta'?"),
    ("misspelt transport", ["train", "--set", "weights.transport=tpc"], "did you mean 'tcp'?"),
    ("config subcommand", ["config", "--set", "trainer.lrr=1"], "did you mean 'trainer.lr'?"),
    ("missing config file", ["train", "{d}/nope.toml"], "does not exist"),
    ("config file is a folder", ["train", "{d}/hasrun"], "is a directory"),
    ("bad TOML", ["train", "{d}/bad.toml"], "not valid TOML"),
    ("unknown key in a file", ["train", "{d}/typo.toml"], "did you mean 'steps'?"),
    ("bad YAML", ["train", "{d}/bad.yaml"], "not valid YAML"),
    ("bad JSON", ["train", "{d}/bad.json"], "not valid JSON"),
    ("config not a mapping", ["train", "{d}/list.json"], "got a list"),
    ("config suffix", ["train", "{d}/c.txt"], "use .toml, .yaml/.yml or .json"),
    ("--resume without --run-dir", ["train", "--resume"], "--resume needs --run-dir"),
    ("--resume of no run", ["train", "--resume", "--run-dir", "{d}/none"],
     "holds no run to resume"),
    ("run dir holds a run", ["train", "--run-dir", "{d}/hasrun"], "already holds a run"),
    ("--resume with another config", ["train", "--resume", "--run-dir", "{d}/hasrun"],
     "different config ("),
    ("--resume of a broken run", ["train", "--resume", "--run-dir", "{d}/broken"],
     "config.json is not valid JSON"),
    ("run dir is a file", ["train", "--run-dir", "{d}/afile"], "is a file, not a folder"),
    ("run dir below a file", ["train", "--run-dir", "{d}/afile/r"], "cannot create it"),
    ("model path missing", ["train", "--set", "model.path={d}/nomodel", "--run-dir", "{d}/r"],
     "not a Hugging Face model folder"),
    ("dataset missing", ["train", "--set", "task.dataset={d}/nope.jsonl", *R], "does not exist"),
    ("dataset bad line", ["train", "--set", "task.dataset={d}/bad.jsonl", *R], "bad.jsonl:2"),
    ("dataset row field", ["train", "--set", "task.dataset={d}/nofield.jsonl", *R],
     "missing field(s) ['prompt']"),
    ("dataset empty", ["train", "--set", "task.dataset={d}/empty.jsonl", *R], "no rows"),
    ("dataset folder", ["train", "--set", "task.dataset={d}/emptyds", *R],
     "not a `datasets` folder"),
    ("dataset without reward", ["train", "--set", "task.dataset={d}/ok.jsonl"], "needs a reward"),
    ("eval rows without dataset", ["train", "--set", "task.eval_dataset={d}/ok.jsonl"],
     "task.eval_dataset needs task.dataset"),
    ("eval larger than task", ["train", "--set", "eval.num_prompts=300"],
     "leaves none to train on"),
    ("reward not importable", ["train", "--set", "task.dataset={d}/ok.jsonl", "--set",
                               "task.reward=tg_no_such_module:f"],
     "cannot import 'tg_no_such_module'"),
    ("reward syntax error", ["train", "--set", "task.dataset={d}/ok.jsonl", "--set",
                             "task.reward=tg_cli_errors_syntax:f"], "SyntaxError"),
    ("transport syntax error", ["train", "--set", "weights.transport=tg_cli_errors_syntax:T"],
     "cannot load tg_cli_errors_syntax:T: SyntaxError"),
    ("reward not callable", ["train", "--set", "task.dataset={d}/ok.jsonl", "--set",
                             f"task.reward={REWARDS}:X"], "is 3, not a function"),
    ("reward name missing", ["train", "--set", "task.dataset={d}/ok.jsonl", "--set",
                             f"task.reward={REWARDS}:okk"], "did you mean 'ok'?"),
    ("reward without colon", ["train", "--set", "task.dataset={d}/ok.jsonl", "--set",
                              f"task.reward={REWARDS}"], "expected 'module:function'"),
    ("ray address nobody listens on", ["train", "--set", "mode=async", "--set",
                                       "weights.transport=tcp", "--set", "cluster.type=ray",
                                       "--set", "cluster.address=127.0.0.1:1"],
     "cluster.address='127.0.0.1:1': cannot connect" if find_spec("ray")
     else "cluster.type='ray' needs the ray package"),
    ("env not importable", ["train", "--set", "task.env=tg_no_such_module:Env"],
     "task.env='tg_no_such_module:Env'"),
]


@pytest.fixture
def case_dir(tmp_path, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a default run directory would land here (and fail the test)
    return tmp_path


def _check(rc: int, err: str, fragment: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("traingym: "), err
    assert sum(x.startswith("traingym: ") for x in lines) == 1, err
    assert fragment in lines[-1], err
    return lines[-1]


@pytest.mark.parametrize("argv,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, fragment, case_dir, capsys, monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("a bad input reached model loading")

    monkeypatch.setattr("traingym.loop.build.load_policy", no_model)
    rc = cli.main([a.replace("{d}", str(case_dir)) for a in argv])
    out, err = capsys.readouterr()
    _check(rc, err, fragment)
    assert out == ""
    assert not (case_dir / "runs").exists() and not (case_dir / "r").exists(), \
        "no run directory before the input is valid"
    assert not (case_dir / "none").exists()


def test_enough_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 20


@pytest.mark.parametrize("argv,fragment", [
    (["trian"], "invalid choice"),
    (["train", "{d}/bad.toml"], "not valid TOML"),
    (["train", "--set", "task.name=mult"], "unknown built-in task 'mult'"),
    (["train", "--set", "task.env=tg_no_such_module:Env"], "cannot import"),
], ids=["argparse", "file syntax", "task name", "env import"])
def test_no_traceback_reaches_the_terminal(argv, fragment, case_dir):
    p = subprocess.run([sys.executable, "-m", "traingym.cli",
                        *[a.replace("{d}", str(case_dir)) for a in argv]],
                       capture_output=True, text=True, timeout=120, cwd=case_dir)
    _check(p.returncode, p.stderr, fragment)
    assert not (case_dir / "runs").exists()


def test_reward_raising_mid_run_exits_1(case_dir, capsys):
    (case_dir / "tg_cli_errors_raises.py").write_text(
        "def reward(sample):\n    raise KeyError('no such field')\n")
    rc = cli.main(["train", "--preset", "tiny", "--quiet", "--set", "steps=1", "--set",
                   "eval.before=false", "--set", "eval.after=false", "--set",
                   "task.reward=tg_cli_errors_raises:reward", "--run-dir", str(case_dir / "r")])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.startswith("traingym: the run stopped: ") and "KeyError" in err, err
