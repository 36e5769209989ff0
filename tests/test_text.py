"""Stop strings and incremental text: several stop strings, a trailing half character at the end of a
request, decoders that drop a leading space."""

from trtllm_bole.text import TextDelta, cut_at_stop


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
