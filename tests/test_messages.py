"""The messages a user can get, in English and Chinese (serve/messages.py): every template in both
languages, and the messages the code really makes, each matched by a template."""
from __future__ import annotations

import re
from dataclasses import replace

import httpx
import pytest

from engine import kernels
from engine.generate import Result, SamplingParams, check_prompt_fits
from model import GPT2, GPT2Config
from model.adapters import check_adapter
from serve import backend
from serve.apis import example_pairs, history_pairs
from serve.inspection import inspect_prompt
from serve.limits import checked_params
from serve.messages import MODEL_LINE, NAMES_ZH, TEMPLATES, localized, translate_one
from serve.model_host import ModelHost, ModelLoadError
from serve.outcome import GREEDY_SAME, SAME_SEED, STOP_REASON_WORDS, Outcome, status_line
from serve.running import (OTHER_SIDE_NOTE, RANDOM_SEED, adapter_state, changed_settings, check_count, check_size, checked_text, compared_state, sampling_params,
                        setting_params)
from tasks import TASKS, DialogueInputs, GenerateInputs, SummarizeInputs, TranslateInputs
from tasks.base import FIRST_STEP_CUT
from ui import chat, tab
from ui.messages import language, word

pytestmark = pytest.mark.slow  # the page's messages too, with Gradio

ENGLISH_WORD = re.compile(r"[A-Za-z]{3,}")
SAMPLE_VALUES = {"name": "prompt", "what": "the text to translate", "unit": "characters", "reason": "max_new_tokens reached",
                 "task": "generate", "adapter": "chat", "adapters": "none", "languages": "English, French, German",
                 "source": "English", "target": "French", "kind": "RuntimeError", "capability": "AVX512",
                 "names": "bundled", "line": "'x'", "settings": "temperature 0.7, top_k 40",
                 "error": "seed must be an integer, got 1.5"}


def sample(template: str) -> str:
    fields = re.findall(r"\{(\w+)\}", template)
    return template.format(**{field: SAMPLE_VALUES.get(field, "12") for field in fields})


@pytest.mark.parametrize("key", TEMPLATES)
def test_every_message_reads_in_english_and_in_chinese(key):
    english, chinese = TEMPLATES[key]
    message = sample(english)
    assert localized(message, "en") == message
    translated = localized(message, "zh")
    assert re.search(r"[\u4e00-\u9fff]", translated), translated
    # names that stay as they are in Chinese: the library, the API's values, the CPU's, the protocol
    own_words = set(ENGLISH_WORD.findall(re.sub(r"\{\w+\}", "", english))) - {"PyTorch", "true", "false", "CPU", "AVX", "HTTP"}
    left = own_words & set(ENGLISH_WORD.findall(translated))
    assert not left, (translated, left)


def test_the_language_is_the_browsers_first_choice():
    class Request:
        def __init__(self, header):
            self.headers = {"accept-language": header} if header is not None else {}

    assert language(Request("zh-CN,zh;q=0.9,en;q=0.8")) == "zh"
    assert language(Request("en-US,zh;q=0.5")) == "en"
    assert language(Request(None)) == "en" and language(None) == "en"
    assert word("error", "zh") == "错误" and word("error", "en") == "Error"


def refusal(call) -> str:
    with pytest.raises((ValueError, ModelLoadError)) as caught:
        call()
    return str(caught.value)


def api_defaults(task: str) -> dict:
    """A task's settings as an API call that names none of them sends them."""
    return {p.name: p.default for p in setting_params(TASKS[task])}


def made_messages() -> list[str]:
    """Messages the code makes, one of each kind a user can meet."""
    tiny = GPT2(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    from model.tokenizer import load_tokenizer
    from model.checkpoint import BUNDLED_DIR
    tokenizer = load_tokenizer(BUNDLED_DIR)
    long = "word " * 3000

    def prompt(task, inputs, max_new_tokens=16, context=512):
        return lambda: TASKS[task].prompt(inputs, tokenizer, context, max_new_tokens, False)

    messages = [
        refusal(lambda: checked_params(SamplingParams(), temperature=9)),
        refusal(lambda: checked_params(SamplingParams(), temperature=0.001)),
        refusal(lambda: checked_params(SamplingParams(), top_k=1.5)),
        refusal(lambda: checked_params(SamplingParams(), top_p="high")),
        refusal(lambda: checked_params(SamplingParams(), stop=("",))),
        refusal(lambda: check_prompt_fits(tiny, 0)),
        refusal(lambda: check_prompt_fits(tiny, 16)),
        refusal(lambda: check_adapter(tiny, "chat")),
        refusal(prompt("generate", GenerateInputs(""))),
        refusal(prompt("translate", TranslateInputs(text="word " * 400), max_new_tokens=300)),
        refusal(prompt("dialogue", DialogueInputs(message=long), max_new_tokens=1)),
        refusal(prompt("dialogue", DialogueInputs(message=""))),
        refusal(prompt("translate", TranslateInputs(text=""))),
        refusal(prompt("translate", TranslateInputs(text="@@@ ###"))),
        refusal(prompt("translate", TranslateInputs(text="Hi", source="English", target="English"))),
        refusal(prompt("summarize", SummarizeInputs(article=""))),
        refusal(lambda: checked_text("prompt", 3)),
        *(refusal(lambda: sampling_params(TASKS["generate"], {**api_defaults("generate"), "seed": seed})) for seed in (-5, 1.5)),
        refusal(lambda: check_size("history", 99, 10)),
        refusal(lambda: check_count("turns in history", 99, 10)),
        refusal(lambda: example_pairs("a = b\n" * 65)),
        refusal(lambda: history_pairs([["only one"]])),
        refusal(lambda: example_pairs("no equals sign")),
        refusal(lambda: inspect_prompt(tiny, tokenizer, "word " * 40, 0, 0)),  # the live view's limit
        refusal(lambda: ModelHost(["bundled"], device="cpu").switch("elsewhere")),
        TASKS["summarize"].prompt(SummarizeInputs(long), tokenizer, 512, 16, False).notes[0],
        TASKS["translate"].prompt(TranslateInputs("Hello.", examples=[]), tokenizer, 512, 16, False).notes[0],
        TASKS["translate"].prompt(TranslateInputs("Hello. Bye."), tokenizer, 512, 16, False).notes[0],
        *TASKS["generate"].prompt(GenerateInputs(long), tokenizer, 512, 16, False).notes,  # what was cut, and why
        TASKS["dialogue"].prompt(DialogueInputs(message="Hi", history=[("a " * 200, "b " * 200)] * 3), tokenizer,
                                 512, 16, False).notes[0],
        kernels.decode_path(),
        tab.notebook_tail("x" * 30, 20)[1],
        *(TASKS["translate"].two_steps(TranslateInputs("Bonjour.", "French", "German"), True)[2].format(
            text=text, prompt=90, generated=7) for text in ("Hello.", "(nothing)")),
        FIRST_STEP_CUT.format(kept=250, tokens=1_200),
        *(OTHER_SIDE_NOTE.format(side=adapter_state(on, 1), note=TASKS["translate"].prompt(
            TranslateInputs("Hello.", examples=[]), tokenizer, 512, 16, False).notes[0]) for on in (False, True)),
        *(status_line(Outcome.done(Result("", 7, 4, 16, 633.3, reason), None, [], []), "en")
          for reason in STOP_REASON_WORDS),
        *(adapter_state(on, scale) for on, scale in ((False, 1.0), (True, 1.0), (True, 0.5))),
        *(compared_state(scale, on) for scale in (1.0, 0.5) for on in (False, True)),
        SAME_SEED, GREEDY_SAME,
        status_line(Outcome.done(Result("", 7, 4, 16, 0.0, "max_tokens"), None, [], []), "en"),  # no speed
        # a page in front of a deployment (serve/backend.py)
        backend.down_message("http://10.0.0.2:8000", httpx.ConnectError("refused")),
        backend.down_message("http://10.0.0.2:8000", httpx.HTTPStatusError(
            "", request=httpx.Request("GET", "http://x"), response=httpx.Response(503))),
        backend.cut_message("http://10.0.0.2:8000"), backend.STOPPED_NOTE,
    ]
    return messages


def test_every_message_the_app_makes_has_its_chinese():
    for message in made_messages():
        assert translate_one(message) != message or message in NAMES_ZH, f"no template for: {message}"
        translated = localized(message, "zh")
        assert re.search(r"[\u4e00-\u9fff]", translated), (message, translated)


def test_the_changed_settings_are_named_and_translated_each():
    defaults = TASKS["summarize"].defaults
    assert changed_settings(defaults, defaults) == []  # the defaults: nothing to add
    changed = changed_settings(replace(defaults, temperature=0.7, top_k=40, seed=5, adapter_scale=0.5), defaults)
    assert changed == [("temperature", 0.7), ("top_k", 40)]  # the seed and strength have their own parts
    outcome = Outcome.done(Result("", 5, 4, 16, 20.0, "max_tokens"), adapter_state(True, 0.5), changed, [])
    assert status_line(outcome, "en").endswith(" · adapter on at strength 0.5 · changed settings: temperature 0.7, top_k 40")
    zh = status_line(outcome, "zh")
    assert NAMES_ZH["temperature"] in zh and NAMES_ZH["top_k"] in zh and "0.7" in zh and "40" in zh
    assert "temperature" not in zh and "top_k" not in zh and "changed" not in zh, zh


def test_a_list_in_a_message_is_translated_item_by_item():
    refused = next(message for message in made_messages() if "English, French, German" in message)
    zh = localized(refused, "zh")
    assert all(NAMES_ZH[name] in zh for name in ("English", "French", "German")), zh
    assert not re.search("English|French|German", zh), zh
    # a user's text with commas in it is no list: it stays as it is
    note = localized("translated through English (first step: 90 prompt + 7 generated tokens): Hello, my friend.", "zh")
    assert note == f"经由{NAMES_ZH['English']}翻译（第一步：提示词 90 + 生成 7 个词元）：Hello, my friend.", note
    # nor is a token of the model's, even one that spells a name the app uses
    assert localized("continued from token 3 with output", "zh") == "从第 3 个词元续写，换为 output"


def test_the_model_line_is_whole_in_each_language():
    for lang, template in MODEL_LINE.items():
        assert set(re.findall(r"\{(\w+)\}", template)) == set(re.findall(r"\{(\w+)\}", MODEL_LINE["en"]))
    zh = re.sub(r"\{\w+\}", "", MODEL_LINE["zh"])
    assert not ENGLISH_WORD.findall(zh)


def test_a_refused_seed_names_the_random_one_the_seed_box_takes():
    for seed, said in ((-5, "seed must be between 0 and 4,294,967,295, got -5"),
                       (1.5, "seed must be an integer, got 1.5")):
        message = refusal(lambda: sampling_params(TASKS["generate"], {**api_defaults("generate"), "seed": seed}))
        assert message == f"{said}; -1 draws a random seed" and RANDOM_SEED == -1  # as TEMPLATES writes it
        zh = localized(message, "zh")
        assert zh.startswith(localized(said, "zh")) and zh.endswith("设为 -1 则随机抽取种子"), zh
    for seed in (-1, None, 0, 7):  # a random seed, and seeds in range, run
        assert sampling_params(TASKS["generate"], {**api_defaults("generate"), "seed": seed}).seed == \
            (None if seed in (-1, None) else seed)


def test_an_import_that_is_no_conversation_says_why_in_both_languages(tmp_path):
    files = {"notes.json": b"{not json", "list.json": b"[1, 2]", "image.json": b"\x89PNG\xff\xfe"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    said = {name: refusal(lambda: chat.read_import(str(tmp_path / name))) for name in files}
    assert said == {"notes.json": "the file is not an exported conversation (not JSON)",
                    "list.json": "the file is not an exported conversation (not a JSON object)",
                    "image.json": "the file is not an exported conversation (not JSON)"}
    assert refusal(lambda: chat.read_import(str(tmp_path / "gone.json"))) == \
        "the file could not be read"
    assert localized(said["notes.json"], "zh") == "该文件不是导出的对话（不是 JSON）"
    # a JSON object that is no conversation says what is wrong in it, as the API would, and where
    (tmp_path / "odd.json").write_text('{"persona": 3, "history": "x"}')
    odd = refusal(lambda: chat.read_import(str(tmp_path / "odd.json")))
    assert odd == "in the file: history must be a list of [user, bot] pairs of text"
    assert localized(odd, "zh") == "文件中：" + localized("history must be a list of [user, bot] pairs of text", "zh")
    assert localized(said["list.json"], "zh") == "该文件不是导出的对话（不是 JSON 对象）"


def test_chinese_text_written_across_lines_shows_no_space_between_its_characters():
    from ui.i18n import CHINESE, unwrapped

    assert unwrapped("做归一化，\n再把子层\n`ln_f`\n在输出层\n\n## 实测") == "做归一化，再把子层 `ln_f` 在输出层\n\n## 实测"
    assert unwrapped("甲\n乙\n丙") == "甲乙丙" and unwrapped("列表：\n- 一\n- 二\n| 表 |") == "列表：\n- 一\n- 二\n| 表 |"
    for key, text in CHINESE.items():
        assert not re.search(r"[^\n]\n(?![-*|#]|\d+\.|```)[^\n]", text), key  # Markdown would show it as a space
    assert "每个块先对注意力和 MLP 子层的*输入*做归一化，再把子层的输出" in CHINESE["architecture_intro"]
