import pytest
import torch

from traingym.runs import checkpoint


def _model_opt(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def test_roundtrip_restores_model_optimizer_and_rng(tmp_path):
    model, opt = _model_opt(0)
    torch.manual_seed(123)
    folder = checkpoint.save(tmp_path, 5, model, opt, {"data_position": 40}, keep=2)
    expected_next = torch.rand(3)
    model2, opt2 = _model_opt(1)
    state = checkpoint.load(folder, model2, opt2)
    assert state["step"] == 5 and state["data_position"] == 40
    assert torch.equal(torch.rand(3), expected_next)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    for k in s1:
        for key in s1[k]:
            assert torch.equal(torch.as_tensor(s1[k][key]), torch.as_tensor(s2[k][key]))


def test_keep_and_uncommitted_folders_ignored(tmp_path):
    model, opt = _model_opt(0)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, model, opt, {"data_position": 0}, keep=2)
    (tmp_path / "step_000009").mkdir()  # a crash before the marker: never loaded
    assert [p.name for p in checkpoint.committed(tmp_path)] == ["step_000002", "step_000003"]


def test_corrupted_file_is_detected(tmp_path):
    model, opt = _model_opt(0)
    folder = checkpoint.save(tmp_path, 1, model, opt, {"data_position": 0}, keep=1)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="sha256"):
        checkpoint.load(folder, *_model_opt(1))
