"""Stop strings and incremental text: several stop strings, a trailing half character at the end of a
request, decoders that drop a leading space."""

from trtllm_bole.text import TextDelta, cut_at_stop, output_text


def test_the_text_is_cut_at_the_earliest_of_several_stop_strings():
    text = "x = 1\nEND\ny = 2\nSTOP\n"
    assert cut_at_stop(text, ["STOP", "END"]) == cut_at_stop(text, ["END", "STOP"]) == "x = 1\n"
    assert cut_at_stop(text, ["nowhere"]) == text


def test_text_delta_holds_back_the_start_of_any_stop_string():
    vocab = {1: "ab", 2: "EN", 3: "D", 4: "c"}

    def decode(ids):
        return "".join(vocab[t] for t in ids)

    delta = TextDelta(decode, stop=["STOP", "END"])
    assert delta([1], False) == "ab"
    assert delta([1, 2], False) == ""  # may be the start of the second stop string
    assert delta([1, 2, 3, 4], True) == ""  # it was: cut there
    other = TextDelta(decode, stop=["STOP", "END"])
    pieces = [other([1], False), other([1, 2], False), other([1, 2, 4], True)]
    assert pieces == ["ab", "", "ENc"]


def test_a_half_character_left_at_the_end_is_handed_out_on_finish():
    """``LLM.generate`` decodes a request that ends mid-character with its U+FFFD; the stream's last
    delta carries it too, so the streamed texts join up to the same text."""
    vocab = {1: "ab", 2: "\ufffd"}

    def decode(ids):
        return "".join(vocab[t] for t in ids)

    delta = TextDelta(decode)
    pieces = [delta([1], False), delta([1, 2], False), delta([1, 2], True)]
    assert pieces == ["ab", "", "\ufffd"]
    assert "".join(pieces) == decode([1, 2])


def test_each_window_is_decoded_with_the_token_before_it():
    """A SentencePiece-style decoder drops the leading space of whatever it decodes first: a new token
    decoded alone would lose its space, so each window starts at the previous settled point."""
    vocab = {1: "\u2581def", 2: "\u2581f", 3: "(x):", 4: "\u2581return", 5: "\u2581x"}

    def decode(ids):
        return "".join(vocab[t] for t in ids).replace("\u2581", " ").removeprefix(" ")

    ids = [1, 2, 3, 4, 5]
    delta = TextDelta(decode)
    pieces = [delta(ids[:n], n == len(ids)) for n in range(1, len(ids) + 1)]
    assert "".join(pieces) == decode(ids) == "def f(x): return x"


def test_the_output_is_read_after_the_prompts_last_whole_character():
    """A prompt of token ids that ends inside a character: an output that finishes it holds the whole
    character; one that does not leaves the prompt's U+FFFD with the prompt; a prompt whose text ends in a
    real U+FFFD keeps it. The stream's pieces join up to the same text, tokens of no text between."""

    def decode(ids):  # byte-level, and id 0 a special token
        return bytes(i for i in ids if i).decode("utf-8", errors="replace")

    emoji = list("\U0001f600".encode())
    cases = [
        (list(b"s = '") + emoji[:2], [0, *emoji[2:], *b"'"], "\U0001f600'"),
        (list(b"s = '") + emoji[:2], list(b"x"), "x"),
        (list("ab\ufffd".encode()), list(b"x"), "x"),
        ([], [*emoji[1:], *b"x"], "\ufffd" * 3 + "x"),  # the output starts mid-character
    ]
    for prompt, output, text in cases:
        assert output_text(decode, prompt, output) == text
        delta = TextDelta(decode, prompt_ids=prompt)
        pieces = [delta(output[:n], n == len(output)) for n in range(1, len(output) + 1)]
        assert "".join(pieces) == text  # a U+FFFD sent early is one the text keeps


def test_a_stream_sends_whole_characters_before_a_half_one():
    """Only the trailing U+FFFD of a character cut between tokens may still change: a window ending in one
    held back every whole character before it too, so a stream of emoji whose every step ended inside
    one sent nothing until the request finished."""

    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    emoji = list("\U0001f600".encode())
    delta = TextDelta(decode)
    assert delta(emoji + emoji[:2], False) == "\U0001f600"
    assert delta(emoji * 2 + emoji[:2], False) == "\U0001f600"
    assert delta(emoji * 3, True) == "\U0001f600"
    stopped = TextDelta(decode, stop=["\U0001f600!"])  # a possible stop's start is still held back
    assert stopped(emoji + emoji[:2], False) == "" and stopped(emoji + list(b"x"), True) == "\U0001f600x"


def test_streamed_pieces_join_up_to_the_cut_output_text_in_random_cases():
    """Random prompts and outputs of a byte-level vocabulary (whole and split multi-byte characters, stray
    bytes, a special token of no text, real U+FFFD), random stop strings and update sizes: the pieces
    join up to ``cut_at_stop(output_text(...))``. The stop search reads only what is new in each update,
    so this is also the check that a stop string spanning updates is found where it starts."""
    import random

    pieces_of = {0: b""}
    for piece in ["a", "b", "EN", "D", "\n", " ", "é", "€", "😀", "\ufffd", "ab", "a\n"]:
        pieces_of[len(pieces_of)] = piece.encode()
    for char in ["é", "😀", "名"]:
        code = char.encode()
        for i in range(1, len(code)):
            for part in (code[:i], code[i:] + b"y"):
                pieces_of[len(pieces_of)] = part
    pieces_of[len(pieces_of)] = b"\x80"

    def decode(ids):
        return b"".join(pieces_of[i] for i in ids).decode("utf-8", errors="replace")

    rng, ids = random.Random(0), list(pieces_of)
    stops = ["END", "a", "ab", "\n\n", "é", "😀", "D\n", "aa", "b a", "ENDEND", "\ufffd", "名y"]
    for _ in range(2000):
        prompt, output = rng.choices(ids, k=rng.randint(0, 6)), rng.choices(ids, k=rng.randint(1, 30))
        stop = rng.sample(stops, rng.randint(0, 3))
        delta, pieces, n = TextDelta(decode, stop, prompt), [], 0
        while n < len(output):
            n = min(len(output), n + rng.choice([0, 1, 1, 2, 5]))
            pieces.append(delta(output[:n], n == len(output)))
        expected = cut_at_stop(output_text(decode, prompt, output), stop)
        assert "".join(pieces) == expected, (prompt, output, stop)


def test_encoding_a_long_text_lets_other_threads_run():
    """A server tokenizes a prompt on its request thread while the engine thread steps; ``encode`` held the
    GIL throughout (a second's stall of every stream for 1.6 MB of text)."""
    import itertools
    import threading
    import time

    from trtllm_bole.llm import DEFAULT_MODEL
    from trtllm_bole.text import Tokenizer

    tokenizer = Tokenizer.find(DEFAULT_MODEL)
    text = "def f(x):\n    return x * 2  # ünï €\n" * 12000
    assert tokenizer.encode(text[:3000]) == tokenizer._tok.encode(text[:3000]).ids  # the same ids
    stamps, done = [], threading.Event()

    def tick() -> None:
        while not done.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.02)
    start = time.perf_counter()
    tokenizer.encode(text)
    took = time.perf_counter() - start
    done.set()
    ticker.join()
    longest = max(b - a for a, b in itertools.pairwise(stamps))
    assert took > 0.05 and longest < took / 2, (took, longest)


def test_a_run_of_tokens_without_text_does_not_widen_the_decoded_window():
    """Special tokens decode to no text (``ignore_eos`` can make thousands of them): each update decoded
    every one of them since the last text again, quadratic in the run. They leave the window where it was;
    the text around them reads as before, a SentencePiece-style leading space included."""
    vocab = {0: "", 1: "\u2581def", 2: "\u2581f"}
    windows = []

    def decode(ids):
        windows.append(len(ids))
        return "".join(vocab[t] for t in ids).replace("\u2581", " ").removeprefix(" ")

    ids = [1] + [0] * 200 + [2]
    delta = TextDelta(decode, prompt_ids=[1])
    pieces = [delta(ids[:n], n == len(ids)) for n in range(1, len(ids) + 1)]
    assert max(windows) <= 3
    assert "".join(pieces) == output_text(decode, [1], ids) == " def f"
