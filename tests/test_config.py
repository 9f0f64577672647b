import pytest

from tui_chat.config import Config, ConfigError, load_config, round_context, save_setting
from tui_chat.engine.params import SamplingParams


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_missing_file_gives_defaults(tmp_path):
    assert load_config(tmp_path / "none.toml") == Config()


def test_full_config_is_read(tmp_path):
    path = write(
        tmp_path,
        'default_model = "~/m.gguf"\nchat_template = "chatml"\nn_ctx = 3000\ngpu_layers = 0\n'
        "[sampling]\ntemperature = 0.2\ntop_k = 10\nstop = ['###']\n",
    )
    config = load_config(path)
    assert config.default_model == "~/m.gguf"
    assert config.chat_template == "chatml"
    assert config.n_ctx == 3072
    assert config.gpu_layers == 0
    assert config.sampling == SamplingParams(temperature=0.2, top_k=10, stop=("###",))


def test_context_rounds_up_to_multiples_of_256():
    assert [round_context(n) for n in (256, 257, 4096, 4097)] == [256, 512, 4096, 4352]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n_ctx = 'big'", "n_ctx must be a whole number"),
        ("n_ctx = 10", "n_ctx must be a whole number between 256"),
        ("chat_template = 'alpaca'", "chat_template must be one of auto, plain"),
        ("gpu_layers = -5", "gpu-layers must be -1"),
        ("colour = 'red'", "unknown setting 'colour'"),
        ("[sampling]\ntemperature = 5", r"temperature must be between 0 and 2 \(got 5\)"),
        ("sampling = 3", r"\[sampling\] must be a table"),
        ("default_model = 3", "default_model must be text"),
        ("n_ctx = [", "cannot read config"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(write(tmp_path, text))
    assert "\n" not in str(caught.value)
    assert str(tmp_path) in str(caught.value)


def test_theme_and_keys_are_read(tmp_path):
    config = load_config(write(tmp_path, 'theme = "nord"\n[keys]\nregenerate = "f5"\n'))
    assert config.theme == "nord" and config.keys == {"regenerate": "f5"}


def test_save_setting_keeps_comments_and_tables(tmp_path):
    path = write(tmp_path, '# my settings\nn_ctx = 2048\n\n[sampling]\ntemperature = 0.3\n')
    save_setting("theme", "tui-chat-dusk", path)
    save_setting("theme", 'say "hi"', path)
    text = path.read_text()
    assert text.startswith("# my settings\nn_ctx = 2048\n")
    assert text.count("theme =") == 1
    config = load_config(path)
    assert config.theme == 'say "hi"' and config.n_ctx == 2048 and config.sampling.temperature == 0.3


def test_save_setting_creates_the_file(tmp_path):
    path = tmp_path / "new" / "config.toml"
    save_setting("theme", "light", path)
    assert load_config(path).theme == "light"


def test_inspector_top_is_validated(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("inspector_top = 5\n")
    assert load_config(path).inspector_top == 5
    path.write_text("inspector_top = 21\n")
    with pytest.raises(ConfigError, match="inspector_top must be a whole number between 0 and 20"):
        load_config(path)


def test_the_list_settings_and_new_samplers_are_read_from_sampling(tmp_path):
    """The config keys README's example shows for issue 20: the samplers, the chain's order, the logit bias."""
    config = load_config(write(
        tmp_path,
        "[sampling]\ndry_multiplier = 0.8\nxtc_probability = 0.5\nmirostat_tau = 5.0\n"
        'sampler_order = ["penalties", "dry", "top_k", "top_p", "min_p", "temperature"]\n'
        'logit_bias = { " Paris" = -inf, "the" = 2.5 }\n',
    ))
    sampling = config.sampling
    assert (sampling.dry_multiplier, sampling.xtc_probability, sampling.mirostat_tau) == (0.8, 0.5, 5.0)
    assert sampling.sampler_order == ("penalties", "dry", "top_k", "top_p", "min_p", "temperature")
    assert sampling.logit_bias == ((" Paris", float("-inf")), ("the", 2.5))
    with pytest.raises(ConfigError, match=r"the logit bias of 'x' must be between -100 and 100, or -inf"):
        load_config(write(tmp_path, '[sampling]\nlogit_bias = { "x" = 1000 }\n'))
    with pytest.raises(ConfigError, match="sampler_order takes names from"):
        load_config(write(tmp_path, '[sampling]\nsampler_order = ["top_k", "warmth"]\n'))
