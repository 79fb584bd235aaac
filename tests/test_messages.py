"""The messages a user can get, in English and Chinese (serve/messages.py): every template in both
languages, and the messages the code really makes, each matched by a template."""
from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import httpx
import pytest

from engine import kernels
from engine.generate import ContextLengthError, Result, SamplingParams
from model import GPT2, GPT2Config
from serve import backend, ingress
from serve.admission import RunQueue, Waiting
from serve.apis import example_pairs, history_pairs
from serve.inspection import inspect_prompt
from serve.limits import added_stops, checked_params
from serve.messages import MODEL_LINE, NAMES_ZH, TEMPLATES, Message, Refusal, english, message_of, render
from serve.model_host import LOAD_STEPS, ModelHost, check_memory, path_message
from serve.outcome import GREEDY_SAME, SAME_SEED, STOP_REASON_WORDS, Outcome, status_line
from serve.apis import APIS
from serve.comparing import (Axis, Comparison, compared_outcome, no_steering, parse_compare, side_labels,
                             side_outcome)
from serve.running import (RANDOM_SEED, adapter_state, changed_settings, check_count, check_size, checked_text,
                           sampling_params, setting_params)
from tasks import TASKS, DialogueInputs, GenerateInputs, SummarizeInputs, TranslateInputs
from ui import presets, tab
from ui.tabs import chat
from ui.messages import language, word

pytestmark = pytest.mark.slow  # the page's messages too, with Gradio

ENGLISH_WORD = re.compile(r"[A-Za-z]{3,}")
SAMPLE_VALUES = {"name": "prompt", "what": "the text to translate", "reason": "max_new_tokens reached",
                 "task": "generate", "adapter": "chat", "adapters": "none", "languages": "English, French, German",
                 "source": "English", "target": "French", "kind": "RuntimeError", "capability": "AVX512",
                 "names": "bundled", "line": "'x'", "value": "1.5", "url": "http://10.0.0.2:8000",
                 "settings": (("temperature", 0.7), ("top_k", 40)), "language": "English", "text": "Hello.",
                 "token": "' the'", "side": Message.keyed("adapter_on"), "note": Message.keyed("no_examples"),
                 "setting": "temperature", "model": "gpt2", "api": "/generate", "fields": "steer_strength",
                 "choices": "adapter, steering", "a": Message.keyed("adapter_off"), "b": Message.keyed("adapter_on"),
                 "shown": Message.keyed("adapter_off"),
                 "error": Message.keyed("not_integer", name="seed", value="1.5")}


def sample(key: str) -> Message:
    """The message `key` with a value of the right kind in each field (a number where its template
    formats one)."""
    fields = re.findall(r"\{(\w+)(:[^}]*)?\}", TEMPLATES[key][0])
    return Message.keyed(key, **{name: 12 if spec or name not in SAMPLE_VALUES else SAMPLE_VALUES[name]
                                 for name, spec in fields})


@pytest.mark.parametrize("key", TEMPLATES)
def test_every_message_reads_in_english_and_in_chinese(key):
    english_template, _ = TEMPLATES[key]
    message = sample(key)
    said_in_english = render(message, "en")
    assert english(message) == said_in_english and "{" not in said_in_english
    if key == "text":  # an error's own words: the same in every language
        assert render(message, "zh") == said_in_english
        return
    translated = render(message, "zh")
    assert re.search(r"[\u4e00-\u9fff]", translated), translated
    # names that stay as they are in Chinese: the library, the API's values, the CPU's, the protocol, the
    # file formats and the tool that reads them, the hash
    own_words = set(ENGLISH_WORD.findall(re.sub(r"\{[^}]*\}", "", english_template))) - {
        "PyTorch", "true", "false", "CPU", "AVX", "HTTP", "GGUF", "llama", "cpp", "safetensors", "sha"}
    left = own_words & set(ENGLISH_WORD.findall(translated))
    assert not left, (translated, left)


def test_a_few_messages_read_as_they_always_have():
    """The rendered text itself, in both languages, for a few templates: numbers formatted as the
    code used to write them, names said as the page labels them."""
    too_long = Message.keyed("too_long_shorten", what="the text to translate", tokens=1_200, room=256, most=300)
    assert english(too_long) == ("the text to translate: 1,200 tokens, but only 256 fit in the context next to "
                                 "max_new_tokens; shorten it, or set max_new_tokens to 300 or less")
    assert render(too_long, "zh") == ("要翻译的文本：需要 1,200 个词元，但留出最大新词元数后，上下文只容得下 256 个；"
                                      "请缩短它，或把最大新词元数设为 300 或更少")
    seed = Message.keyed("random_seed", error=Message.keyed("out_of_range", name="seed", low=0, high=4_294_967_295,
                                                            value="-5"))
    assert english(seed) == "seed must be between 0 and 4,294,967,295, got -5; -1 draws a random seed"
    assert render(seed, "zh") == "随机种子必须在 0 到 4,294,967,295 之间，收到的是 -5；设为 -1 则随机抽取种子"
    assert english(Message.keyed("adapter_on_scaled", scale=0.5)) == "adapter on at strength 0.5"


def test_the_language_is_the_browsers_first_choice():
    class Request:
        def __init__(self, header):
            self.headers = {"accept-language": header} if header is not None else {}

    assert language(Request("zh-CN,zh;q=0.9,en;q=0.8")) == "zh"
    assert language(Request("en-US,zh;q=0.5")) == "en"
    assert language(Request(None)) == "en" and language(None) == "en"
    assert word("error", "zh") == "错误" and word("error", "en") == "Error"


def refusal(call) -> Message:
    with pytest.raises(Refusal) as caught:
        call()
    return caught.value.message


def api_defaults(task: str) -> dict:
    """A task's settings as an API call that names none of them sends them."""
    return {p.name: p.default for p in setting_params(TASKS[task])}


def made_messages() -> list[Message]:
    """Messages the code makes, one of each kind a user can meet."""
    tiny = GPT2(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    from model.tokenizer import load_tokenizer
    from model.checkpoint import BUNDLED_DIR
    tokenizer = load_tokenizer(BUNDLED_DIR)
    long = "word " * 3000
    host = ModelHost(["bundled"], device="cpu")
    loading_host = ModelHost(["bundled"], device="cpu", allow_load=True)
    translate_note = TASKS["translate"].prompt(TranslateInputs("Hello.", examples=[]), tokenizer, 512, 16, False).notes[0]

    def prompt(task, inputs, max_new_tokens=16, context=512):
        return lambda: TASKS[task].prompt(inputs, tokenizer, context, max_new_tokens, False)

    return [
        refusal(lambda: checked_params(SamplingParams(), temperature=9)),
        refusal(lambda: checked_params(SamplingParams(), temperature=0.001)),
        refusal(lambda: checked_params(SamplingParams(), top_k=1.5)),
        refusal(lambda: checked_params(SamplingParams(), top_p="high")),
        refusal(lambda: added_stops(("",), ())),
        refusal(lambda: added_stops(tuple("abcdefg"), ("\nUser:", "\nBot:"))),
        refusal(lambda: sampling_params(TASKS["generate"], {**api_defaults("generate"), "stop": 3})),
        message_of(ContextLengthError(16, 16)),
        refusal(lambda: host.look_inside("Hi", 1, 1, "chat")),
        # the Architecture tab's trace (serve/tracing.py)
        refusal(lambda: host.trace("Hello world", "Hi")),
        refusal(lambda: host.trace("Hello world")),
        refusal(lambda: host.trace("Hello world", noise_span="Paris")),
        refusal(lambda: host.trace("Hello world", noise_span="world", answer="Paris")),
        refusal(lambda: host.trace("Hello world", "Hello world")),
        refusal(lambda: host.trace("word " * 100, noise_span="word")),
        refusal(lambda: host.trace("", noise_span="word")),
        refusal(prompt("generate", GenerateInputs(""))),
        refusal(prompt("translate", TranslateInputs(text="word " * 400), max_new_tokens=300)),
        refusal(prompt("dialogue", DialogueInputs(message=long), max_new_tokens=1)),
        refusal(prompt("dialogue", DialogueInputs(message=""))),
        refusal(prompt("translate", TranslateInputs(text=""))),
        refusal(prompt("translate", TranslateInputs(text="@@@ ###"))),
        refusal(prompt("translate", TranslateInputs(text="Hi", source="English", target="English"))),
        refusal(prompt("summarize", SummarizeInputs(article=""))),
        refusal(prompt("summarize", SummarizeInputs(article="🙂🙂"))),
        refusal(lambda: checked_text("prompt", 3)),
        *(refusal(lambda: sampling_params(TASKS["generate"], {**api_defaults("generate"), "seed": seed})) for seed in (-5, 1.5)),
        refusal(lambda: check_size("history", 99, 10)),
        refusal(lambda: check_count("turns in history", 99, 10)),
        refusal(lambda: example_pairs("a = b\n" * 65)),
        refusal(lambda: history_pairs([["only one"]])),
        refusal(lambda: example_pairs("no equals sign")),
        refusal(lambda: inspect_prompt(tiny, tokenizer, "word " * 40, 0, 0)),  # the live view's limit
        refusal(lambda: host.switch("elsewhere")),
        # loading from the page (serve/model_host.py)
        refusal(lambda: host.load("gpt2")),
        refusal(lambda: loading_host.load(" ")),
        refusal(lambda: loading_host.unload("bundled")),
        refusal(lambda: check_memory("gpt2-xl", GPT2Config.preset("gpt2-xl", vocab_size=10**12))),
        *(Message.keyed(f"load_step_{step}", name="gpt2") for step in LOAD_STEPS),
        TASKS["summarize"].prompt(SummarizeInputs(long), tokenizer, 512, 16, False).notes[0],
        translate_note,
        TASKS["translate"].prompt(TranslateInputs("Hello. Bye."), tokenizer, 512, 16, False).notes[0],
        *TASKS["generate"].prompt(GenerateInputs(long), tokenizer, 512, 16, False).notes,  # what was cut, and why
        TASKS["dialogue"].prompt(DialogueInputs(message="Hi", history=[("a " * 200, "b " * 200)] * 3), tokenizer,
                                 512, 16, False).notes[0],
        path_message(kernels.current_path()),
        path_message(kernels.DecodePath(), int8=True),
        *(path_message(kernels.DecodePath(why, "AVX")) for why in kernels.WHY_NOT),
        tab.notebook_tail("x" * 30, 20)[1],
        *(TASKS["translate"].two_steps(TranslateInputs("Bonjour.", "French", "German"), True)[2].with_fields(
            text=text, prompt=90, generated=7) for text in ("Hello.", "(nothing)")),
        Message.keyed("first_step_cut", kept=250, tokens=1_200),
        *(adapter_state(on, scale) for on, scale in ((False, 1.0), (True, 1.0), (True, 0.5))),
        # a comparison (serve/comparing.py): what it may name, its sides' labels, its status line's parts
        *(refusal(lambda bad=bad: parse_compare(bad, ["bundled"])) for bad in (
            "adapters", "model:gpt2", "setting:warmth=1", "setting:top_k=1.5", "setting:temperature=9")),
        *(refusal(lambda values=values: APIS["generate"].request(values)) for values in (
            "Hi", {"prompt": "Hi", "warmth": 1}, {"seed": 1})),
        *compared_messages(translate_note),
        SAME_SEED, GREEDY_SAME,
        # a page in front of a deployment (serve/backend.py)
        backend.down_message("http://10.0.0.2:8000", httpx.ConnectError("refused")),
        backend.down_message("http://10.0.0.2:8000", httpx.HTTPStatusError(
            "", request=httpx.Request("GET", "http://x"), response=httpx.Response(503))),
        backend.cut_message("http://10.0.0.2:8000"), backend.STOPPED_NOTE,
        refusal(lambda: backend.RemoteHost.load(SimpleNamespace(url="http://10.0.0.2:8000"), "gpt2")),
        Outcome.edited().message,  # a Chat reply edited by hand
        # Chat's context line (serve/model_host.py, conversation_room)
        *host.conversation_room("", [["word " * 60, "b " * 60]] * 5, "", 256),
        Message.keyed("will_drop_turn", count=1),
        # a tab's presets (ui/presets.py)
        *(Message.keyed(key) for key in ("preset_default", "preset_greedy")),
        *(Message.keyed(key, preset="Calm") for key in ("preset_saved", "preset_applied", "preset_deleted")),
        Message.keyed("preset_left_out", preset="Calm", names="mirostat, temperature"),
        refusal(lambda: presets.preset_settings("Hot", {"presets": {"Hot": {"top_k": 1.5}}}, {"top_k": 40},
                                                TASKS["generate"])),
        *(refusal(lambda: presets.with_preset({}, name, {}, TASKS["generate"])) for name in ("", "x" * 99, "Default")),
        refusal(lambda: presets.with_preset({"presets": {str(n): {} for n in range(50)}}, "more", {}, TASKS["generate"])),
        refusal(lambda: presets.preset_settings("Odd", {"presets": {"Odd": 3}}, {}, TASKS["generate"])),
        refusal(lambda: presets.without_preset({}, None)),
        # a deployment's ingress, where a replica stops (serve/ingress.py)
        ingress.REPLICA_LOST, ingress.replicas_lost(4), ingress.replica_failed(RuntimeError("x")),
        *steering_messages(host),
        # the queue every run takes its turn in (serve/admission.py)
        refusal(lambda: RunQueue(0, 0).turn().__enter__()), Waiting(3).message, Outcome.withdrawn().message,
    ]


def compared_messages(note: Message) -> list[Message]:
    """A comparison's labels and the parts of its status line, for each kind of side."""
    def side(model="bundled", adapter=False, **params):
        return SimpleNamespace(model=model, adapter=adapter, params=replace(SamplingParams(), **params))
    labels = [label for axis, sides in ((Axis("adapter"), (side(), side(adapter=True, adapter_scale=0.5))),
                                        (Axis("steering"), (side(), side())),
                                        (Axis("model", "gpt2"), (side(), side(model="gpt2"))),
                                        (Axis("setting", "temperature", 0.7), (side(), side(temperature=0.7))))
              for label in side_labels(axis, sides)]
    done = Outcome.done(Result("", 7, 4, 16, 20.0, "eos"), None, [], [])
    comparison = Comparison("adapter", tuple(labels[:2]), ({}, {}), 0, ([], []), (None, None), ("", ""),
                            (done, done.noted(note)), (None, None))
    return [*labels, *compared_outcome(comparison).notes, side_outcome(comparison, 1).notes[-1], no_steering().message]
def steering_messages(host: ModelHost) -> list[Message]:
    """What steering says: a run's steering (by lines or a file, measured or as a page in front of
    replicas knows it), the vector files' notes and refusals (serve/vectors.py)."""
    import tempfile
    from pathlib import Path

    import gguf
    import numpy as np

    from engine.steering_files import save_steering
    from serve.running import steering_asked, steering_state
    from serve.vectors import MAX_FILE_BYTES, read_vector, write_vector_files

    config = host.current.config
    steer = {"steer_positive": "Happy.\nGlad.", "steer_negative": "Sad.\nGloomy.", "steer_strength": 2.0}
    made = []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        vector = host.steering_vector({**steer, "steer_layer": 1})
        made.append(write_vector_files(vector, folder / "one")[1])  # no GGUF at layer 1
        paths, _ = write_vector_files(replace(vector, layer=3), folder / "three")
        file = read_vector(paths[0], config)
        made.append(file.imported)
        asked = steering_asked({**steer, "steer_file": file.record}, config)
        made += [steering_state(asked, 3.0, 20.0), steering_state(asked), steering_state(steering_asked(steer, config))]
        for name, write in (("noise.gguf", lambda path: path.write_bytes(b"GGUF\xff")),
                            ("big.safetensors", lambda path: path.write_bytes(b"\x00" * (MAX_FILE_BYTES + 1)))):
            write(folder / name)
            made.append(refusal(lambda: read_vector(folder / name, config)))
        for changed in (dict(vector=[1.0] * 8), dict(n_layer=12)):
            paths, _ = write_vector_files(replace(vector, **changed), folder / str(len(made)))
            made.append(refusal(lambda: read_vector(paths[-1], config)))
        save_steering(folder / "older.safetensors", replace(vector, layer=9).steering, [], [], "bundled")  # no n_layer
        made.append(refusal(lambda: read_vector(folder / "older.safetensors", config)))
        writer = gguf.GGUFWriter(str(folder / "two.gguf"), "controlvector")
        for k in (1, 2):
            writer.add_tensor(f"direction.{k}", np.ones(config.n_embd, dtype=np.float32))
        for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                     writer.close):
            step()
        made.append(refusal(lambda: read_vector(folder / "two.gguf", config)))
    made += [refusal(lambda: host.steering_vector({})),
             refusal(lambda: steering_asked({**steer, "steer_file": "x"}, config))]
    return made


def test_every_message_the_app_makes_has_its_chinese():
    for message in made_messages():
        assert message.key in TEMPLATES and message.key != "text", f"no template for: {message}"
        translated = render(message, "zh")
        assert re.search(r"[\u4e00-\u9fff]", translated), (message, translated)
    for reason in STOP_REASON_WORDS:  # every status line, with a speed and without
        for speed in (633.3, 0.0):
            line = status_line(Outcome.done(Result("", 7, 4, 16, speed, reason), None, [], []), "zh")
            assert re.search(r"[\u4e00-\u9fff]", line) and not re.search("[A-Za-z]{3,}", line), line


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
    refused = next(message for message in made_messages() if message.field("languages"))
    zh = render(refused, "zh")
    assert all(NAMES_ZH[name] in zh for name in ("English", "French", "German")), zh
    assert not re.search("English|French|German", zh), zh
    # a user's text with commas in it is no list: it stays as it is
    note = render(Message.keyed("translated_through", language="English", prompt=90, generated=7,
                                text="Hello, my friend."), "zh")
    assert note == f"经由{NAMES_ZH['English']}翻译（第一步：提示词 90 + 生成 7 个词元）：Hello, my friend.", note
    # nor is a token of the model's, even one that spells a name the app uses
    assert render(Message.keyed("continued_from", index=3, token="output"), "zh") == "从第 3 个词元续写，换为 output"


def test_the_model_line_is_whole_in_each_language():
    for lang, template in MODEL_LINE.items():
        assert set(re.findall(r"\{(\w+)\}", template)) == set(re.findall(r"\{(\w+)\}", MODEL_LINE["en"]))
    zh = re.sub(r"\{\w+\}", "", MODEL_LINE["zh"])
    assert not ENGLISH_WORD.findall(zh)


def test_a_refused_seed_names_the_random_one_the_seed_box_takes():
    for seed, inner in ((-5, Message.keyed("out_of_range", name="seed", low=0, high=4_294_967_295, value="-5")),
                        (1.5, Message.keyed("not_integer", name="seed", value="1.5"))):
        message = refusal(lambda: sampling_params(TASKS["generate"], {**api_defaults("generate"), "seed": seed}))
        assert message == Message.keyed("random_seed", error=inner) and RANDOM_SEED == -1  # as TEMPLATES writes it
        assert english(message) == f"{english(inner)}; -1 draws a random seed"
        zh = render(message, "zh")
        assert zh.startswith(render(inner, "zh")) and zh.endswith("设为 -1 则随机抽取种子"), zh
    for seed in (-1, None, 0, 7):  # a random seed, and seeds in range, run
        assert sampling_params(TASKS["generate"], {**api_defaults("generate"), "seed": seed}).seed == \
            (None if seed in (-1, None) else seed)


def test_an_import_that_is_no_conversation_says_why_in_both_languages(tmp_path):
    files = {"notes.json": b"{not json", "list.json": b"[1, 2]", "image.json": b"\x89PNG\xff\xfe"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    said = {name: refusal(lambda: chat.read_import(str(tmp_path / name))) for name in files}
    assert said == {"notes.json": Message.keyed("not_a_conversation", kind="not JSON"),
                    "list.json": Message.keyed("not_a_conversation", kind="not a JSON object"),
                    "image.json": Message.keyed("not_a_conversation", kind="not JSON")}
    assert refusal(lambda: chat.read_import(str(tmp_path / "gone.json"))) == Message.keyed("unreadable_file")
    assert render(said["notes.json"], "zh") == "该文件不是导出的对话（不是 JSON）"
    assert english(said["list.json"]) == "the file is not an exported conversation (not a JSON object)"
    # a JSON object that is no conversation says what is wrong in it, as the API would, and where
    (tmp_path / "odd.json").write_text('{"persona": 3, "history": "x"}')
    odd = refusal(lambda: chat.read_import(str(tmp_path / "odd.json")))
    assert odd == Message.keyed("in_the_file", error=Message.keyed("history_pairs"))
    assert english(odd) == "in the file: history must be a list of [user, bot] pairs of text"
    assert render(odd, "zh") == "文件中：" + render(Message.keyed("history_pairs"), "zh")
    assert render(said["list.json"], "zh") == "该文件不是导出的对话（不是 JSON 对象）"


def test_chinese_text_written_across_lines_shows_no_space_between_its_characters():
    from ui.i18n import CHINESE, unwrapped

    assert unwrapped("做归一化，\n再把子层\n`ln_f`\n在输出层\n\n## 实测") == "做归一化，再把子层 `ln_f` 在输出层\n\n## 实测"
    assert unwrapped("甲\n乙\n丙") == "甲乙丙" and unwrapped("列表：\n- 一\n- 二\n| 表 |") == "列表：\n- 一\n- 二\n| 表 |"
    for key, text in CHINESE.items():
        assert not re.search(r"[^\n]\n(?![-*|#]|\d+\.|```)[^\n]", text), key  # Markdown would show it as a space
    assert "每个块先对注意力和 MLP 子层的*输入*做归一化，再把子层的输出" in CHINESE["architecture_intro"]
