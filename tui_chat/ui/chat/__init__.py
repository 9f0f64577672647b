"""The chat screen and its rooms: one module per chat feature, each with the keys it answers (keys.py is the one
table of them) and what it opens. The screen itself composes the panels, runs the lifecycle and routes a reply's
events; a room reaches the conversation through the screen's session and views, never another room."""
