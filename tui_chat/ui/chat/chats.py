"""Chats: a new one (Ctrl+N), the saved ones (Ctrl+L) and going on with one, its system prompt (F6)."""

from __future__ import annotations

from textual import work

from ...config import data_dir
from ...engine.params import SamplingParams
from ...history import HistoryError
from ...session import ChatSession
from ..panel.sampling import SamplingPanel
from ..screens.tools import restore_chat_tools
from .room import Room


class ChatsRoom(Room):
    async def action_new_chat(self) -> None:
        """A new chat starts from the config's settings, not from those of the chat before it."""
        await self._switch_to(self.workspace.new_chat(self.live, **self.options), self.workspace.config.sampling)
        self.view.prompt.focus()

    async def _switch_to(self, session: ChatSession, settings: SamplingParams) -> None:
        """Another conversation on screen, already the workspace's (the one before kept with its settings, a
        reply still being written ended as stopped)."""
        self.reply = None
        self.query_one(SamplingPanel).set_values(settings.as_dict())
        self.view.session = session
        self.show_figures()  # at once: its messages may take a while to come down and go up
        self.query_one(SamplingPanel).show_format(session.output_format)
        await self.view.show(session)

    @work(group="open-chat", exclusive=True)
    async def action_conversations(self) -> None:
        if self.workspace.history is None:
            self.notify("The history could not be opened: chats are not saved this session.", severity="warning")
            return
        from ..screens.conversations import ConversationsScreen

        chosen = await self.app.push_screen_wait(ConversationsScreen(self.workspace, data_dir() / "exports"))
        if chosen is not None:
            await self.open_conversation(chosen)

    async def open_conversation(self, conversation_id: int) -> None:
        """Go on with a saved chat: its messages and branches, system prompt, settings, tools and model (loaded for
        it: until then the chat stays on the model in use, and a message waits for the load)."""
        try:
            session, conversation, wanted = self.workspace.reopen(conversation_id, self.live, **self.options)
        except HistoryError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        await self._switch_to(session, conversation.sampling)
        if wanted is not None:
            self.loader.load(wanted)
        self.notify(f"Opened “{conversation.title}”", timeout=3, markup=False)
        restore_chat_tools(self, self.workspace, session)

    @work(group="system-prompt")
    async def action_system_prompt(self) -> None:
        from ..screens.ask import AskText

        hint = "Sent before the chat with every reply. Applies from the next reply; saved with this chat."
        text = await self.app.push_screen_wait(AskText("System prompt", self.session.system_prompt, hint,
                                                       multiline=True))
        if text is not None and text != self.session.system_prompt:
            self.session.set_system_prompt(text)
            self.notify("System prompt set: it applies from the next reply.", timeout=3)
            self.view.recount_draft()
