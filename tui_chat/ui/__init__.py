"""The app's screens and widgets (Textual). Nothing here imports llama.cpp: the engine runs in a process of its own.

Set before Textual is first imported, which reads it once: Textual tells a lone Esc from the first byte of a key's
escape sequence by waiting ESCDELAY ms for more, 100 by default, so every Esc (stop a reply, close a dialog) waited
that long before the app saw it. A terminal writes a key's sequence in one go; 25 ms tells the two apart, as
tmux's escape-time (10 ms) and neovim's ttimeoutlen (50) do. A user's own ESCDELAY (a slow link) still rules.
"""

import os

os.environ.setdefault("ESCDELAY", "25")
