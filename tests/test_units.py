"""Sizes and moments written one way wherever tui-chat shows them."""

import time

from tui_chat.units import format_size, local_time


def test_sizes_are_binary_with_iec_names():
    assert [format_size(n) for n in (512, 1536, 253_000_000, 4 * 2**30, 3 * 2**40)] == [
        "512 B", "1.5 KiB", "241.3 MiB", "4.0 GiB", "3.0 TiB"]


def test_a_moment_is_local_time_to_the_minute():
    moment = time.mktime((2026, 11, 25, 19, 20, 59, 0, 0, -1))
    assert local_time(moment) == "2026-11-25 19:20"
