"""A coarse (0/1) reward for the tiny task, so that many groups have no signal: 1 when the
completion starts with a digit. Module-level: async engine processes import it by name
(pytest's prepend import mode puts tests/algorithms on sys.path; spawned engines inherit it)."""


def first_is_digit(sample) -> float:
    text = sample.completion_text.lstrip()
    return 1.0 if text[:1].isdigit() else 0.0
