"""Data made by code for chapter 09: verifiable tasks and a rule-based "human" who compares replies.

Everything here is text, turned into bytes by :func:`encode` (vocabulary 256, as
:func:`course_lib.data.encode_corpus`), so any byte-level :class:`course_lib.model.GPT` fits,
the shipped Shakespeare model included. A response ends with the marker :data:`END` (a newline);
a response cut off before it is unfinished, and every checker here gives it 0.

Two kinds of task, for the two kinds of reward in the chapter::

    verifiable task (RL with verifiable rewards)        preferences (RLHF, DPO)

    prompt    "3+4="                                    prompt    "tea:"
    response  "7\\n"                                    replies   "kind good\\n"  vs  "dull\\n"
    check     1.0 if response == "7\\n" else 0.0         human     prefers the kinder reply
              (a program decides; nothing is learned)             (a reward model must learn it)

* :class:`AdditionTask` (``"12+7=" -> "19\\n"``) and :class:`SortTask` (``"cab>" -> "abc\\n"``)
  have a correct answer (:meth:`Task.solve`), demonstrations for supervised fine-tuning and an
  exact checker :meth:`Task.check`. :meth:`Task.check_format` is a deliberately *flawed*
  checker that looks at the form only (digits then END; letters in order then END): a policy
  can satisfy it without solving anything, which is reward hacking.
* :class:`PreferenceTask`: replies are a few words; the "human" scores a reply by its kind words
  minus its unkind ones (:meth:`PreferenceTask.score`) and, of two replies to one prompt,
  prefers the higher score (:meth:`PreferenceTask.pairs`). Byte-level models learn this in
  seconds, and a policy can over-optimise it ("good good good good").

Everything is deterministic given a seed (``random.Random(seed)``); nothing is downloaded.
Left out: noisy human labels (Bradley-Terry sampling of the choice), ties, multi-turn dialogue.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = ["END", "encode", "decode", "Task", "AdditionTask", "SortTask", "Preference", "PreferenceTask"]

END = "\n"  # the end-of-response marker; one byte, 10


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids (vocabulary 256).

    >>> encode("3+4=")
    [51, 43, 52, 61]
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    """Token ids (bytes) back to text; bytes that are not valid UTF-8 become U+FFFD.

    >>> decode([55, 10])
    '7\\n'
    """
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")


class Task:
    """A task whose answers a program can check (chapter 09). Subclasses define
    :meth:`make_prompt`, :meth:`solve` (the correct response without :data:`END`) and
    :meth:`well_formed`; the rest is shared."""

    def make_prompt(self, rng: random.Random) -> str:
        raise NotImplementedError

    def solve(self, prompt: str) -> str:
        raise NotImplementedError

    def well_formed(self, prompt: str, response: str) -> bool:
        raise NotImplementedError

    def prompts(self, n: int, seed: int = 0) -> list[str]:
        """``n`` prompts drawn with ``random.Random(seed)`` (repeats possible)."""
        _check_n(n)
        rng = random.Random(seed)
        return [self.make_prompt(rng) for _ in range(n)]

    def demonstrations(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` pairs ``(prompt, correct response + END)`` for supervised fine-tuning."""
        return [(p, self.solve(p) + END) for p in self.prompts(n, seed)]

    def check(self, prompt: str, response: str) -> float:
        """The verifier: 1.0 if ``response`` is exactly the answer followed by :data:`END`, else 0.0."""
        return float(response == self.solve(prompt) + END)

    def check_format(self, prompt: str, response: str) -> float:
        """A *flawed* verifier: 1.0 for any response of the answer's form, right or wrong."""
        return float(self.well_formed(prompt, response))


@dataclass(frozen=True)
class AdditionTask(Task):
    """``"a+b="`` -> the decimal sum then :data:`END`, with ``0 <= a, b <= max_operand``.

    >>> task = AdditionTask(max_operand=20)
    >>> task.prompts(3, seed=0)
    ['12+13=', '1+8=', '16+15=']
    >>> task.check("12+7=", "19\\n"), task.check("12+7=", "18\\n"), task.check("12+7=", "19")
    (1.0, 0.0, 0.0)
    >>> task.check_format("12+7=", "18\\n")   # flawed: any digits then END
    1.0
    """

    max_operand: int = 9  # operands are drawn from 0 .. max_operand

    def __post_init__(self):
        m = self.max_operand
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"max_operand must be an int >= 1, got {m!r}")

    def make_prompt(self, rng: random.Random) -> str:
        return f"{rng.randint(0, self.max_operand)}+{rng.randint(0, self.max_operand)}="

    def solve(self, prompt: str) -> str:
        match = re.fullmatch(r"(\d+)\+(\d+)=", prompt)
        if match is None:
            raise ValueError(f"an addition prompt looks like '12+7=', got {prompt!r}")
        return str(int(match[1]) + int(match[2]))

    def well_formed(self, prompt: str, response: str) -> bool:
        """Digits followed by END."""
        return re.fullmatch(r"[0-9]+\n", response) is not None


@dataclass(frozen=True)
class SortTask(Task):
    """``"cab>"`` -> the prompt's letters in alphabetical order, then :data:`END`.

    >>> task = SortTask(length=3, alphabet="abcd")
    >>> task.prompts(2, seed=0)
    ['dda>', 'cdd>']
    >>> task.check("cab>", "abc\\n"), task.check("cab>", "acb\\n")
    (1.0, 0.0)
    >>> task.check_format("cab>", "aaa\\n")   # flawed: letters in order, not the prompt's letters
    1.0
    """

    length: int = 3          # letters per prompt
    alphabet: str = "abcde"  # drawn with replacement from these

    def __post_init__(self):
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length must be an int >= 1, got {self.length!r}")
        if not self.alphabet or not re.fullmatch(r"[a-z]+", self.alphabet):
            raise ValueError(f"alphabet must be lowercase letters a-z, got {self.alphabet!r}")

    def make_prompt(self, rng: random.Random) -> str:
        return "".join(rng.choice(self.alphabet) for _ in range(self.length)) + ">"

    def solve(self, prompt: str) -> str:
        if not re.fullmatch(r"[a-z]+>", prompt):
            raise ValueError(f"a sort prompt looks like 'cab>', got {prompt!r}")
        return "".join(sorted(prompt[:-1]))

    def well_formed(self, prompt: str, response: str) -> bool:
        """Lowercase letters in non-decreasing order, then END (it does not ask *which* letters)."""
        letters = response[:-1]
        return re.fullmatch(r"[a-z]+\n", response) is not None and list(letters) == sorted(letters)


@dataclass(frozen=True)
class Preference:
    """One comparison by the human: for ``prompt``, ``chosen`` was preferred to ``rejected``."""

    prompt: str
    chosen: str
    rejected: str


@dataclass(frozen=True)
class PreferenceTask:
    """Replies of a few words to a topic (``"tea:" -> "kind good\\n"``), and a rule-based human
    who likes kind words (chapter 09).

    :meth:`score` is the human's hidden taste: the number of ``kind`` words minus the number of
    ``unkind`` words in the reply (other text counts 0). :meth:`pairs` are what the human tells
    us: two random replies to one prompt, the higher-scoring one chosen (equal scores are
    skipped). :meth:`demonstrations` are random replies, kind or not: the SFT policy learns the
    form, not the taste.

    >>> task = PreferenceTask()
    >>> task.score("tea:", "kind good dull\\n")
    1.0
    >>> task.pairs(1, seed=0)
    [Preference(prompt='rain:', chosen='good bad\\n', rejected='dull grim bad\\n')]
    """

    topics: tuple[str, ...] = ("tea", "cat", "sun", "rain", "song")
    kind: tuple[str, ...] = ("good", "kind", "glad", "nice")      # each counts +1
    unkind: tuple[str, ...] = ("bad", "rude", "grim", "dull")     # each counts -1
    max_words: int = 3                                            # replies have 1 .. max_words words

    def __post_init__(self):
        for name in ("topics", "kind", "unkind"):
            words = getattr(self, name)
            if not words or not all(isinstance(w, str) and re.fullmatch(r"[a-z]+", w) for w in words):
                raise ValueError(f"{name} must be a non-empty tuple of lowercase words, got {words!r}")
        both = sorted(set(self.kind) & set(self.unkind))
        if both:
            raise ValueError(f"a word cannot be both kind and unkind: {both}")
        if isinstance(self.max_words, bool) or not isinstance(self.max_words, int) or self.max_words < 1:
            raise ValueError(f"max_words must be an int >= 1, got {self.max_words!r}")

    def make_prompt(self, rng: random.Random) -> str:
        return rng.choice(self.topics) + ":"

    def make_reply(self, rng: random.Random) -> str:
        words = self.kind + self.unkind
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, self.max_words))) + END

    def prompts(self, n: int, seed: int = 0) -> list[str]:
        """``n`` prompts (topics followed by ``:``), drawn with ``random.Random(seed)``."""
        _check_n(n)
        rng = random.Random(seed)
        return [self.make_prompt(rng) for _ in range(n)]

    def demonstrations(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` pairs ``(prompt, random reply)``: the form of a reply, with no taste in it."""
        _check_n(n)
        rng = random.Random(seed)
        return [(self.make_prompt(rng), self.make_reply(rng)) for _ in range(n)]

    def score(self, prompt: str, response: str) -> float:
        """The human's taste: kind words minus unkind words (an unfinished reply scores 0)."""
        if not response.endswith(END):
            return 0.0
        words = response.split()
        return float(sum(w in self.kind for w in words) - sum(w in self.unkind for w in words))

    def pairs(self, n: int, seed: int = 0) -> list[Preference]:
        """``n`` comparisons: two random replies to one prompt, the one with the higher
        :meth:`score` chosen; draws with equal scores are skipped."""
        _check_n(n)
        rng, out = random.Random(seed), []
        while len(out) < n:
            prompt, a, b = self.make_prompt(rng), self.make_reply(rng), self.make_reply(rng)
            sa, sb = self.score(prompt, a), self.score(prompt, b)
            if sa != sb:
                out.append(Preference(prompt, a, b) if sa > sb else Preference(prompt, b, a))
        return out
