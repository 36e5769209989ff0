"""Text around token ids: a checkpoint's tokenizer and incremental detokenization for streams."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from pathlib import Path


class Tokenizer:
    """``tokenizer.json`` of a checkpoint, through the ``tokenizers`` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the library raises a bare Exception that names no file
            raise ValueError(f"{path}: not a tokenizer the `tokenizers` library can read ({e})") from None

    @classmethod
    def find(cls, model_dir: Path, vocab_size: int | None = None) -> Tokenizer | None:
        """The checkpoint's ``tokenizer.json`` (None without one). Given the model's ``vocab_size``, a
        tokenizer with ids past it is refused: another model's, whose prompts would fail one by one."""
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            return None
        tokenizer = cls(path)
        if vocab_size is not None and tokenizer.max_id >= vocab_size:
            raise ValueError(
                f"{path}: its ids reach {tokenizer.max_id}, past the model's vocabulary (vocab_size "
                f"{vocab_size} in config.json): the tokenizer of another model?"
            )
        return tokenizer

    @functools.cached_property
    def max_id(self) -> int:
        """The largest id the tokenizer can give, added tokens included."""
        return max(self._tok.get_vocab(with_added_tokens=True).values())

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``. Through ``encode_batch``, which lets go of the GIL while it works (``encode``
        holds it: a prompt of megabytes, tokenized on a server's request thread, stopped the engine thread
        and the metrics heartbeat for seconds)."""
        return self._tok.encode_batch([text])[0].ids

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """At least the UTF-8 bytes any one token stands for (its vocabulary entry's own bytes: a
        byte-level or SentencePiece entry spells its bytes with at least as many), so a text of ``n``
        bytes takes at least ``n / max_token_bytes`` tokens."""
        return max(len(entry.encode()) for entry in self._tok.get_vocab(with_added_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))

    @functools.cached_property
    def special_texts(self) -> frozenset[str]:
        """The special tokens' texts (``<|endoftext|>``), which :meth:`decode` skips: no text holds them."""
        return frozenset(t.content for t in self._tok.get_added_tokens_decoder().values() if t.special)


def stops_never_met(stop: Sequence[str], special_texts: Collection[str]) -> list[str]:
    """The stop strings that hold a special token's text: decoded text never does (decoding skips special
    tokens), so they would never end a request; its id belongs in ``stop_token_ids``."""
    return [s for s in stop if any(t in s for t in special_texts)]


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any stop string (all of it when none occurs)."""
    return text[: min((text.index(s) for s in stop if s in text), default=len(text))]


LEAD_TOKENS = 4
"""Prompt tokens an output's text is decoded after: a character's unfinished bytes span at most three."""


def text_after(decode: Callable[[list[int]], str], lead: list[int], ids: list[int]) -> str | None:
    """The text ``ids`` add to the tokens ``lead`` decoded before them. Where ``lead`` ends inside a
    character (its text ends in U+FFFD) and ``ids`` finish it, the character is theirs: their text starts
    after the lead's last whole character. None when the decoder rewrote the lead's text otherwise."""
    before = decode(lead)
    after = decode(lead + ids)
    for head in (before, before.removesuffix("\ufffd")):
        if after.startswith(head):
            return after[len(head) :]
    return None


def output_text(decode: Callable[[list[int]], str], prompt_ids: list[int], output_ids: list[int]) -> str:
    """A request's output as text, read after its prompt: a prompt of token ids may end inside a
    character (an earlier output cut mid-emoji by ``max_tokens``) that the output's first bytes finish."""
    text = text_after(decode, prompt_ids[-LEAD_TOKENS:], output_ids)
    return decode(output_ids) if text is None else text


class TextDelta:
    """Incremental detokenization that hands out only new text, decoding a short window per update.

    Only the tokens new since the last settled point are decoded (together with the tokens just
    before them, whose context a merge may need). Tokens of no text, alone or after the context
    (special tokens, which decoding skips; not the bytes of a character still cut), leave that context
    as it is: a run of them under ``ignore_eos`` grew the window, and each update decoded the whole run
    again. Text that may still change is held back until the
    request finishes: a trailing U+FFFD (a multi-byte character cut between tokens) and a tail that
    could be the start of a stop string; on finish the text is cut at the first stop string, as
    :meth:`LLM.generate` cuts it. The first window starts in the prompt's last tokens, so the output's
    text reads as :func:`output_text` reads it.
    """

    def __init__(
        self,
        decode: Callable[[list[int]], str] | None,
        stop: Sequence[str] = (),
        prompt_ids: Sequence[int] = (),
    ) -> None:
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.lead = list(prompt_ids[-LEAD_TOKENS:])  # the output's text is read after them (output_text)
        self.text = ""  # the decoded output_ids[: self.read]
        self.context = self.lead  # the tokens the new ones are decoded after: the last ones settled
        self.read = 0
        self.sent = 0  # characters of self.text already handed out
        self.pending = ""  # the unsettled window's text but its trailing U+FFFD, which can no longer change
        self.longest = max(map(len, self.stop), default=0)
        self.cut: int | None = None  # where the first stop string starts in text + pending, once one does
        self.searched = 0  # characters of text + pending searched for stop strings (none found)

    def __call__(self, output_ids: list[int], finished: bool) -> str:
        if self.decode is None:
            return ""
        if len(output_ids) > self.read:
            piece = text_after(self.decode, self.context, output_ids[self.read :])
            whole = piece is None  # the decoder rewrote text before the new tokens: decode all again
            if whole:
                piece = output_text(self.decode, self.lead, output_ids)
                self.cut, self.searched = None, 0  # and search it all again
            if not (piece or whole or finished) and not self.decode(output_ids[self.read :]):
                self.read, self.pending = len(output_ids), ""  # no text of their own: the context stays
            elif finished or (piece and not piece.endswith("\ufffd")):
                self.text = piece if whole else self.text + piece
                self.context, self.read = output_ids[self.read :], len(output_ids)
                self.pending = ""
            else:  # only the last character (a trailing U+FFFD) may still change: the rest can be sent
                self.pending = "" if whole else piece.removesuffix("\ufffd")
        text = self._cut_at_stop(self.text + self.pending)
        if not finished:
            text = text[: len(text) - self._possible_stop(text)]
        delta = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return delta

    def _cut_at_stop(self, text: str) -> str:
        """``cut_at_stop(text, self.stop)``, searching only what is new since the last call (a stop string
        ending there starts at most ``longest - 1`` characters before it): the text before it does not
        change, and a search of all of it on every update cost O(length) a token."""
        if self.cut is None and self.stop:
            start = max(0, self.searched - self.longest + 1)
            found = [i for s in self.stop if (i := text.find(s, start)) >= 0]
            self.cut, self.searched = min(found, default=None), len(text)
        return text if self.cut is None else text[: self.cut]

    def _possible_stop(self, text: str) -> int:
        """Length of the longest tail of ``text`` that begins (and is shorter than) a stop string: only
        the places of the stop string's first character in the last ``len(s) - 1`` characters are
        tried, longest first."""
        longest = 0
        for s in self.stop:
            tail = text[max(0, len(text) - len(s) + 1) :]
            start = tail.find(s[0])
            while start >= 0 and len(tail) - start > longest:
                if s.startswith(tail[start:]):
                    longest = len(tail) - start
                    break
                start = tail.find(s[0], start + 1)
        return longest
