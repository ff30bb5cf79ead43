"""text.TextStream (token-by-token streaming text) against text.finish (the whole completion at
once): the same text, kept tokens and pieces; multi-byte characters never split; nothing after
a stop string is ever sent."""

import pytest

from traingym.models.loader import tiny_tokenizer
from traingym.serve.text import TextStream, finish

TEXTS = ["What is 2 + 3? The answer is 5.", "café 日本語 😀 ok", "a😀b 12 + 1 = 13",
         "ééé"]
STOPS = [[], ["answer"], ["5."], ["日本"], ["😀"], [" = ", "zz"], ["What"], ["é"], ["3 + 1"]]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def stream(tok, ids, stops, end_reason):
    s = TextStream(tok, stops, (tok.eos_token_id,))
    pieces, released = [], []
    for t in ids:
        new, rel = s.feed(t)
        pieces.append(new)
        released += rel
        if s.stopped:
            break
    if s.finish_reason is None:
        new, rel = s.end(end_reason)
        pieces.append(new)
        released += rel
    return s, pieces, released


@pytest.mark.parametrize("stops", STOPS)
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("eos", [False, True])
def test_stream_equals_finish(tok, text, stops, eos):
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    s, pieces, released = stream(tok, ids, stops, "length")
    want, kept, reason, want_pieces = finish(tok, ids, "stop" if eos else "length", stops,
                                             (tok.eos_token_id,))
    assert "".join(pieces) == want
    assert s.finish_reason == reason
    assert released == list(range(kept))
    assert [s.piece(i) for i in released] == want_pieces
    sent = ""
    for p in pieces:  # every prefix sent is whole characters and never reaches a stop
        sent += p
        assert "\ufffd" not in sent
        assert all(st not in sent for st in stops)


def test_multibyte_characters_wait_for_their_bytes_and_text_streams_early(tok):
    ids = tok("日本語 and more words here", add_special_tokens=False)["input_ids"]
    assert len(ids) > len("日本語 and more words here".encode()) // 4  # byte pieces
    _, pieces, _ = stream(tok, ids, [], "length")
    nonempty = [p for p in pieces if p]
    assert len(nonempty) > 3  # sent as it comes, not at the end
    assert nonempty[0] in ("日", "日本", "日本語")
    assert pieces[0] == ""  # the first byte piece of 日 alone is held back


def test_held_prefix_of_a_stop_string_is_released_when_the_stop_does_not_follow(tok):
    ids = tok("the ans is 5, answer", add_special_tokens=False)["input_ids"]
    s, pieces, _ = stream(tok, ids, ["answer"], "length")
    assert "".join(pieces) == "the ans is 5, "
    assert s.stopped and s.finish_reason == "stop"
