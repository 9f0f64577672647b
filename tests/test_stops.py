from tui_chat.engine.local.reply import kept_token_count
from tui_chat.engine.stops import StopScanner, Utf8Stream


def feed_all(scanner, pieces):
    return [scanner.feed(piece) for piece in pieces]


def test_text_without_stops_flows_straight_through():
    scanner = StopScanner()
    assert feed_all(scanner, ["Hel", "lo"]) == ["Hel", "lo"]
    assert scanner.visible == "Hello"


def test_stop_sequence_is_cut_and_never_shown():
    scanner = StopScanner(("\nUser:",))
    shown = feed_all(scanner, [" Paris", ".", "\n", "User", ":", " more"])
    assert "".join(shown) == " Paris."
    assert shown[2] == "" and shown[3] == ""
    assert scanner.stopped and scanner.visible == " Paris."


def test_held_back_text_is_released_when_it_does_not_complete():
    scanner = StopScanner(("\nUser:",))
    assert feed_all(scanner, ["a", "\nUs", "ed"]) == ["a", "", "\nUsed"]
    assert not scanner.stopped


def test_stop_inside_one_piece_and_earliest_of_several():
    scanner = StopScanner(("END", "###"))
    assert scanner.feed("one ### two END") == "one "
    assert scanner.visible == "one " and scanner.matched == "###", "the footer names the one it ended on"


def test_stop_spanning_many_pieces():
    scanner = StopScanner(("<stop>",))
    assert "".join(feed_all(scanner, list("ab<sto") + ["p>cd"])) == "ab"


def test_flush_shows_a_dangling_prefix_at_the_end():
    scanner = StopScanner(("\nUser:",))
    scanner.feed("Hi\nUs")
    assert scanner.visible == "Hi"
    assert scanner.flush() == "\nUs"
    assert scanner.visible == "Hi\nUs"


def test_utf8_split_across_tokens_appears_whole():
    stream = Utf8Stream()
    data = "é🙂".encode()
    assert stream.decode(data[:1]) == "" and stream.pending
    assert stream.decode(data[1:3]) == "é" and stream.pending
    assert stream.decode(data[3:]) == "🙂" and not stream.pending


def test_utf8_cut_character_becomes_replacement_on_flush():
    stream = Utf8Stream()
    stream.decode("🙂".encode()[:2])
    assert stream.flush() == "\ufffd"


def test_kept_tokens_stop_at_the_visible_text():
    # token ends after each token; None = inside a character
    assert kept_token_count([3, 5, 9], visible_len=5) == 2
    assert kept_token_count([3, None, 6], visible_len=6) == 3
    assert kept_token_count([3, None, 6], visible_len=5) == 1
    assert kept_token_count([], visible_len=0) == 0
