"""The shape of a tinker-cookbook RL step through the SDK: sample a group from the current
weights, score it, send importance_sampling with the sampler's log-probs and advantages,
step, repeat. At temperature 1 the sampler's log-probs are the trainer's, so the first ratio
is 1 and the loss is -sum(advantages); over the steps the reward (the share of even token ids,
about a half for the untrained model) rises."""

import numpy as np
from conftest import datum


def test_rl_steps_raise_the_reward(live, tokenizer):
    from tinker import types

    tc = live.client().create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
    prompt = tokenizer.encode("What is 2 + 3? The answer is")
    params = types.SamplingParams(max_tokens=4, temperature=1.0, stop=[])
    rewards = []
    for step in range(8):
        sampler = tc.save_weights_and_get_sampling_client().result()
        group = sampler.sample(types.ModelInput.from_ints(prompt), 16,
                               types.SamplingParams(**{**params.model_dump(), "seed": step})
                               ).result().sequences
        r = np.array([np.mean([t % 2 == 0 for t in s.tokens]) for s in group])
        rewards.append(r.mean())
        adv = r - r.mean()
        data = []
        for s, a in zip(group, adv):
            tokens = prompt + list(s.tokens)
            n_prompt = len(prompt) - 1  # target positions before the completion
            data.append(datum(tokens,
                              logprobs=[0.0] * n_prompt + list(s.logprobs),
                              advantages=[0.0] * n_prompt + [float(a)] * len(s.tokens)))
        fb = tc.forward_backward(data, "importance_sampling")
        tc.optim_step(types.AdamParams(learning_rate=1e-1)).result()
        out = fb.result()
        if step == 0:  # ratio 1: the loss is -sum over tokens of the advantages
            want = -sum(float(a) * len(s.tokens) for s, a in zip(group, adv))
            assert abs(out.metrics["loss:sum"] - want) < 1e-3
            for o, s in zip(out.loss_fn_outputs, group):
                np.testing.assert_allclose(o["logprobs"].to_numpy()[n_prompt:], s.logprobs,
                                           rtol=1e-4, atol=1e-4)
    assert rewards[0] < 0.7 and min(rewards[-2:]) > 0.9, rewards
