"""Chats: a new one (Ctrl+N), the saved ones (Ctrl+L) and going on with one, its system prompt (F6)."""

from __future__ import annotations

from ...config import data_dir
from ...engine.params import SamplingParams
from ...history import HistoryError
from ...session import ChatSession
from .room import ChatReopened, Room


class ChatsRoom(Room):
    async def action_new_chat(self) -> None:
        """A new chat starts from the config's settings, not from those of the chat before it."""
        chat = self.chat
        await self._switch_to(chat.workspace.new_chat(chat.live, **chat.options), chat.workspace.config.sampling)
        chat.view.prompt.focus()

    async def _switch_to(self, session: ChatSession, settings: SamplingParams) -> None:
        """Another conversation on screen, already the workspace's (the one before kept with its settings, a
        reply still being written ended as stopped)."""
        self.chat.reply = None
        sampling = self.chat.panels.sampling
        sampling.set_values(settings.as_dict())
        self.chat.view.session = session
        self.chat.panels.show_figures()  # at once: its messages may take a while to come down and go up
        sampling.show_format(session.output_format)
        await self.chat.view.show(session)

    def action_conversations(self) -> None:
        if self.chat.workspace.history is None:
            self.chat.notify("The history could not be opened: chats are not saved this session.",
                             severity="warning")
            return
        self.chat.work(self._pick_conversation, group="open-chat", exclusive=True)

    async def _pick_conversation(self) -> None:
        from ..screens.conversations import ConversationsScreen

        chosen = await self.chat.app.push_screen_wait(ConversationsScreen(self.chat.workspace, data_dir() / "exports"))
        if chosen is not None:
            await self.open_conversation(chosen)

    async def open_conversation(self, conversation_id: int) -> None:
        """Go on with a saved chat: its messages and branches, system prompt, settings, tools and model (loaded for
        it: until then the chat stays on the model in use, and a message waits for the load)."""
        chat = self.chat
        try:
            session, conversation, wanted = chat.workspace.reopen(conversation_id, chat.live, **chat.options)
        except HistoryError as error:
            chat.notify(str(error), severity="error", markup=False)
            return
        await self._switch_to(session, conversation.sampling)
        if wanted is not None:
            chat.loader.load(wanted)
        chat.notify(f"Opened “{conversation.title}”", timeout=3, markup=False)
        chat.post(ChatReopened(session))

    def action_system_prompt(self) -> None:
        self.chat.work(self._edit_system_prompt, group="system-prompt")

    async def _edit_system_prompt(self) -> None:
        from ..screens.ask import AskText

        hint = "Sent before the chat with every reply. Applies from the next reply; saved with this chat."
        text = await self.chat.app.push_screen_wait(AskText("System prompt", self.chat.session.system_prompt, hint,
                                                            multiline=True))
        if text is not None and text != self.chat.session.system_prompt:
            self.chat.session.set_system_prompt(text)
            self.chat.notify("System prompt set: it applies from the next reply.", timeout=3)
            self.chat.view.recount_draft()
