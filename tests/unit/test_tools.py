"""Tools: schemas from typed functions, the Hermes parser, malformed calls as error results,
and a tool-use episode whose tool messages are appended as ids and masked out of the loss."""

import asyncio

import pytest

from traingym.core.toolcalls import BadCall, HermesParser, ToolCall
from traingym.core.types import Completion
from traingym.envs.render import PromptRenderer
from traingym.envs.tools import ToolTask, run_call, tool_schema
from traingym.envs.transcript import Transcript
from traingym.models.loader import tiny_tokenizer


def multiply(a: int, b: int = 2) -> int:
    """Multiply two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


async def slow_echo(text: str) -> dict:
    """Echo text back, asynchronously.

    Args:
        text: what to echo
    """
    await asyncio.sleep(0)
    return {"echo": text}


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: ignored
    """
    raise RuntimeError("disk on fire")


TOOLS = {"multiply": multiply, "slow_echo": slow_echo, "broken": broken}


def answer(sample) -> float:
    return float("42" in sample.final_text)


def test_schema_from_signature_and_docstring():
    fn = tool_schema(multiply)["function"]
    assert fn["name"] == "multiply" and fn["description"] == "Multiply two integers."
    assert fn["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first number"}
    assert fn["parameters"]["required"] == ["a"]

    def undocumented(a: int) -> int:
        return a

    with pytest.raises(Exception, match="docstring"):
        ToolTask([undocumented], answer)


def test_hermes_parser_reads_calls_and_names_malformed_ones():
    p = HermesParser()
    text = ('I will call. <tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n'
            '</tool_call><tool_call>{"name": "multiply", "arguments": "{\\"a\\": 1}"}</tool_call>'
            '<tool_call>{name: multiply}</tool_call><tool_call>[1, 2]</tool_call>'
            '<tool_call>{"name": "multiply", "arguments": [1]}</tool_call><tool_call>{"name": "x"')
    calls = p.parse(text)
    assert calls[:2] == [ToolCall("multiply", {"a": 6, "b": 7}), ToolCall("multiply", {"a": 1})]
    assert [type(c) for c in calls[2:]] == [BadCall] * 4
    assert "not valid JSON" in calls[2].message and "JSON object" in calls[3].message
    assert "must be a JSON object" in calls[4].message and "not closed" in calls[5].message
    assert p.parse("no tools here, the answer is 42") == []


@pytest.mark.parametrize("call, expected", [
    (ToolCall("multiply", {"a": 6, "b": 7}), ("multiply", "42")),
    (ToolCall("multiply", {"a": "6"}), ("multiply", "12")),  # lax coercion, like pydantic
    (ToolCall("slow_echo", {"text": "hi"}), ("slow_echo", '{"echo": "hi"}')),
    (ToolCall("divide", {}), ("divide", "Error: unknown tool 'divide'; available: "
                                        "['broken', 'multiply', 'slow_echo']")),
    (ToolCall("multiply", {"b": 1}), ("multiply", "Error: wrong arguments for multiply: "
                                                  "missing a required argument: 'a'")),
    (ToolCall("multiply", {"a": 1, "c": 1}), ("multiply", "Error: wrong arguments for multiply: "
                                                          "got an unexpected keyword argument 'c'")),
    (ToolCall("broken", {"x": 1}), ("broken", "Error: broken raised RuntimeError: disk on fire")),
    (BadCall("tool call is not valid JSON"), ("error", "Error: tool call is not valid JSON")),
])
def test_calls_and_malformed_calls_give_results_not_crashes(call, expected):
    assert asyncio.run(run_call(TOOLS, call)) == expected


def test_mistyped_argument_is_an_error_result():
    name, out = asyncio.run(run_call(TOOLS, ToolCall("multiply", {"a": "six"})))
    assert name == "multiply" and out.startswith("Error: argument 'a' of multiply: ")


def test_tool_episode_error_message_appended_as_masked_ids():
    tok = tiny_tokenizer()
    renderer = PromptRenderer(tok)
    env = ToolTask([multiply, broken], answer)({"prompt": "What is 6 * 7?"}, renderer)
    obs = asyncio.run(env.reset())
    assert "<tools>" in obs.text and '"name": "multiply"' in obs.text  # template ignores tools=
    run = Transcript(obs.prompt_ids)

    def turn(text, prompt_ids):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        c = Completion(prompt_ids, ids, [-1.0] * len(ids), "stop", 0)
        run.add_policy(c)
        return asyncio.run(env.step(c)), ids

    result, p1 = turn('<tool_call>{"name": "multiply", "arguments": {"a": 6,}}</tool_call>',
                      obs.prompt_ids)
    assert not result.done
    reply = result.next_observation.text
    assert reply.startswith("\n<|im_start|>tool\nError: tool call is not valid JSON")
    e1 = run.env_tokens(result.next_observation.prompt_ids)
    assert e1 == tok(reply, add_special_tokens=False)["input_ids"]
    run.add_env(e1)
    result, p2 = turn('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>',
                      result.next_observation.prompt_ids)
    assert "\n<|im_start|>tool\n42<|im_end|>" in result.next_observation.text
    e2 = run.env_tokens(result.next_observation.prompt_ids)
    run.add_env(e2)
    result, p3 = turn("It is 42.", result.next_observation.prompt_ids)
    assert result.done and result.reward == 1.0
    assert run.completion_ids == p1 + e1 + p2 + e2 + p3
    assert run.loss_mask == [1] * len(p1) + [0] * len(e1) + [1] * len(p2) + [0] * len(e2) + \
        [1] * len(p3)
    assert env.transcript.completion_ids == run.completion_ids  # the env kept the same ids
    # with canonical policy tokens, the appended ids equal a full re-render of the chat
    t1 = '<tool_call>{"name": "multiply", "arguments": {"a": 6,}}</tool_call>'
    t2 = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    error = asyncio.run(run_call({}, HermesParser().parse(t1)[0]))[1]
    chat = env.first_messages() + [
        {"role": "assistant", "content": t1}, {"role": "tool", "content": error},
        {"role": "assistant", "content": t2}, {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "It is 42."}]
    full = tok.apply_chat_template(chat, tokenize=False)
    assert full.endswith("<|im_end|>\n")
    assert tok(full[:-1], add_special_tokens=False)["input_ids"] == list(run.context)
