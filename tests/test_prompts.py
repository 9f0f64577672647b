import pytest

from tui_chat.engine.base import Message
from tui_chat.engine.prompts import PromptError, choose_format
from tui_chat.engine.templates import NAMED_TEMPLATES

CHAT = [
    Message("system", "Be brief."),
    Message("user", "What is the capital of France?"),
    Message("assistant", " Paris. "),
    Message("user", "And Germany?"),
]


def test_base_model_gets_a_plain_transcript():
    fmt = choose_format("auto", None)
    assert fmt.name == "plain"
    assert fmt.render(CHAT) == (
        "Be brief.\n\nUser: What is the capital of France?\nAssistant: Paris.\nUser: And Germany?\nAssistant:"
    )
    assert fmt.implicit_stops == ("\nUser:",)


def test_transcript_of_earlier_turn_is_a_prefix_of_the_next():
    fmt = choose_format("plain", None)
    first = fmt.render(CHAT[:2]) + " Paris."
    assert fmt.render(CHAT).startswith(first)


def test_model_template_wins_in_auto():
    fmt = choose_format("auto", "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    assert fmt.name == "model" and fmt.implicit_stops == ()
    assert fmt.render(CHAT[:2], bos_token="<s>") == "<s>[system]Be brief.[user]What is the capital of France?"


def test_named_template_overrides_model_template():
    fmt = choose_format("chatml", "{{ 'ignored' }}")
    assert fmt.render(CHAT[1:2]) == (
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_gemma_template_folds_system_into_first_user_turn():
    text = choose_format("gemma", None).render(CHAT, bos_token="<bos>")
    assert text.startswith("<bos><start_of_turn>user\nBe brief.\n\nWhat is the capital of France?<end_of_turn>\n")
    assert text.endswith("<start_of_turn>user\nAnd Germany?<end_of_turn>\n<start_of_turn>model\n")


def test_every_named_template_renders():
    for name in NAMED_TEMPLATES:
        assert "And Germany?" in choose_format(name, None).render(CHAT)


def test_unknown_template_lists_the_known_ones():
    with pytest.raises(PromptError, match="unknown chat template 'alpaca': choose one of auto, plain, chatml"):
        choose_format("alpaca", None)


def test_template_raising_an_exception_is_a_clean_error():
    fmt = choose_format("auto", "{{ raise_exception('System role not supported') }}")
    with pytest.raises(PromptError, match="System role not supported"):
        fmt.render(CHAT)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% for m in messages %}{{ m.__class__.__init__.__globals__ }}{% endfor %}",
    ],
)
def test_template_cannot_reach_python_internals(template):
    with pytest.raises(PromptError):
        choose_format("auto", template).render(CHAT)
