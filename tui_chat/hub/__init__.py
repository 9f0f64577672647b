"""GGUF models from the Hugging Face hub and on this machine: search, download, list. No Textual here.

huggingface_hub is imported only inside the functions that reach the hub (`http`, `catalog`), when the network
is wanted, so starting the app and listing or loading local models never touches it.
"""


class HubError(Exception):
    """A hub or download failure the user must read: one clear line (network, disk, a bad answer)."""


class HubInputError(HubError):
    """The user named something that cannot work (bad name, missing repo, no access): exit status 2."""
