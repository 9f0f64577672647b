"""The `tui-chat` commands, one module each with `add_parser(commands)` and a `run(args, config) -> int`
(the chat UI, the default, has only `run`); `common.py` holds what they share."""
