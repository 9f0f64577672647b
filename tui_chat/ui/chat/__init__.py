"""The chat screen and its rooms: one module per chat feature, each a small class with the keys it answers (keys.py
is the one table of them), the messages routed to it and what it opens. The screen makes the rooms, composes the
panels, runs the lifecycle and routes a reply's events; a room is given a context (room.py: the workspace, the
session and its view, the panels, the one reply starter) and reaches another room only by a message."""
