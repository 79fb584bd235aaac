"""Tasks: exact prompt formats, fitting to the context, post-processing, and run_task end to end
with a tiny random GPT-2 and the bundled model's tokenizer (the one the app starts on)."""
import threading
from dataclasses import replace

import pytest
import torch

from model.config import GPT2Config
from engine.generate import Sampler
from model import load_pretrained
from model.gpt2 import GPT2
from model.checkpoint import BUNDLED_DIR
from model.tokenizer import load_tokenizer
from .conftest import make_lora_adapter, refused
from tasks import (DEFAULT_EXAMPLES, TASKS, DialogueInputs, GenerateInputs, Prompt, SummarizeInputs, TaskDone,
                   TaskUpdate, TranslateInputs, first_sentences, next_prompt, run_task)
from tasks.base import PromptTooLong
from tasks.messages import Message
from tasks.translation import FIRST_SENTENCE_ONLY, NO_EXAMPLES

N_CTX = 128


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(BUNDLED_DIR)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    return GPT2(GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=N_CTX, n_embd=32, n_layer=2, n_head=2)).eval()


def build(name, inputs, tokenizer, max_prompt_tokens=1000, adapter_on=False) -> Prompt:
    return TASKS[name].build_prompt(inputs, tokenizer, max_prompt_tokens, adapter_on)


def run(model, tokenizer, name, inputs, **params):
    """All events of one run_task call, with the task's defaults plus `params`."""
    task = TASKS[name]
    return list(run_task(task, model, tokenizer, inputs, replace(task.defaults, **params)))


def test_registry_order_and_adapters():
    assert list(TASKS) == ["generate", "dialogue", "translate", "summarize"]
    assert [TASKS[name].adapter for name in TASKS] == [None, "dialogue", "translate", "summarize"]


# --- exact prompt formats ---------------------------------------------------------------------

def test_generate_prompt_is_the_text_as_written(tokenizer):
    prompt = build("generate", GenerateInputs("Once upon a time "), tokenizer)
    assert prompt.text == "Once upon a time "
    assert prompt.ids == tokenizer.encode("Once upon a time ")
    assert prompt.notes == []


def test_dialogue_prompt(tokenizer):
    inputs = DialogueInputs("Where is\nthe gold?", history=[("Hi", "Ahoy!"), ("Who are you?", "A pirate.")],
                            persona="Bot is a friendly pirate.")
    prompt = build("dialogue", inputs, tokenizer)
    assert prompt.text == ("Bot is a friendly pirate.\n"
                           "User: Hi\nBot: Ahoy!\n"
                           "User: Who are you?\nBot: A pirate.\n"
                           "User: Where is the gold?\nBot:")
    assert prompt.ids == tokenizer.encode(prompt.text)
    assert build("dialogue", inputs, tokenizer, adapter_on=True).text == prompt.text


def test_dialogue_prompt_without_persona_or_history(tokenizer):
    assert build("dialogue", DialogueInputs("Hello"), tokenizer).text == "User: Hello\nBot:"


def test_translate_prompt_uses_example_pairs(tokenizer):
    prompt = build("translate", TranslateInputs(" The dog runs. "), tokenizer)
    assert prompt.text == ("I would like a cup of coffee. = Je voudrais une tasse de café.\n"
                           "The weather is nice today. = Il fait beau aujourd'hui.\n"
                           "My brother lives in a small town. = Mon frère habite dans une petite ville.\n"
                           "We are reading a book in the garden. = Nous lisons un livre dans le jardin.\n"
                           "The dog runs. =")
    assert prompt.ids == tokenizer.encode(prompt.text)


def test_translate_prompt_other_direction_and_own_examples(tokenizer):
    inputs = TranslateInputs("Der Hund läuft.", source="German", target="English", examples=[("Ja.", "Yes.")])
    assert build("translate", inputs, tokenizer).text == "Deutsch = English\nJa. = Yes.\nDer Hund läuft. ="
    assert build("translate", replace(inputs, examples=None), tokenizer).text.startswith(
        "Ich hätte gern eine Tasse Kaffee. = I would like a cup of coffee.\n")


def test_translate_says_when_no_example_pairs_are_sent(tokenizer):
    emptied = build("translate", TranslateInputs("Der Hund läuft.", "German", "English", examples=[]), tokenizer)
    assert emptied.text == "Deutsch = English\nDer Hund läuft. ="
    assert emptied.notes == [NO_EXAMPLES]
    assert build("translate", TranslateInputs("Der Hund läuft.", "German", "English"), tokenizer).notes == []
    # with the adapter on no pairs are ever sent, nor needed: its language tags say what to do
    assert build("translate", TranslateInputs("Der Hund.", examples=[]), tokenizer, adapter_on=True).notes == []


@pytest.mark.parametrize("adapter_on", [False, True])
def test_translate_sends_and_says_only_the_first_sentence(tokenizer, adapter_on):
    def prompt(text: str) -> Prompt:
        return build("translate", TranslateInputs(text, "English", "French"), tokenizer, adapter_on=adapter_on)

    assert prompt("I have a dog. It is black.\nWe walk.").notes == [FIRST_SENTENCE_ONLY]
    assert prompt("Where is it? Here!").notes == [FIRST_SENTENCE_ONLY]
    for one_sentence in ("I have a dog.", "Dr. Smith has a dog.", "I have a dog"):
        assert prompt(one_sentence).notes == []
    # The model reads only the sentence the note says it translates: sent whole, it translated
    # "I am hungry. Where is the bakery?" as "Où est la bakery ?", the second one.
    sent = prompt("I am hungry. Where is the bakery?").text
    assert "I am hungry." in sent and "bakery" not in sent
    # a training pair keeps its whole text
    pair = TASKS["translate"].format_example(TranslateInputs("I am hungry. Where is it?"), "J'ai faim. Où est-il ?")
    assert "Where is it?" in pair[0]


@pytest.mark.parametrize("examples", [[], [("dog", "Hund")], [["dog", "Hund"], ["cat", "Katze"]]])
def test_translate_prompt_names_the_target_where_the_pairs_may_not(tokenizer, examples):
    """No pairs or the user's own: the text alone (or `dog = Hund`) does not tell the model which
    language to write, and the bundled model answered in French. A first line in the pairs' format
    names both languages, each in itself, and is kept when the examples must be dropped."""
    inputs = TranslateInputs("The weather is nice today.", "English", "German", examples)
    prompt = build("translate", inputs, tokenizer)
    pairs = "".join(f"{source} = {target}\n" for source, target in examples)
    assert prompt.text == f"English = Deutsch\n{pairs}The weather is nice today. ="
    assert prompt.ids == tokenizer.encode(prompt.text)
    if examples:
        fitted = build("translate", inputs, tokenizer, max_prompt_tokens=len(tokenizer.encode(
            "English = Deutsch\nThe weather is nice today. =")))
        assert fitted.text == "English = Deutsch\nThe weather is nice today. =" and fitted.notes[0].key == "dropped_examples"
    for source, target, first in [("French", "English", "français = English\n"),
                                  ("English", "French", "English = français\n"),
                                  ("German", "French", "Deutsch = français\n")]:
        assert build("translate", TranslateInputs("x", source, target, examples), tokenizer).text.startswith(first)


def test_translate_builtin_pairs_get_no_languages_line(tokenizer):
    """The built-in pairs show the direction themselves: the GPT-2 paper's prompt, as it is, whether
    they come as None or written out in the box."""
    builtin = build("translate", TranslateInputs("The dog runs.", "English", "German"), tokenizer)
    assert builtin.text.startswith("I would like a cup of coffee. = Ich hätte gern eine Tasse Kaffee.\n")
    written = TranslateInputs("The dog runs.", "English", "German", [list(pair) for pair in DEFAULT_EXAMPLES[
        "English", "German"]])
    assert build("translate", written, tokenizer).text == builtin.text


def test_translate_prompt_with_adapter_is_zero_shot_with_language_tags(tokenizer):
    prompt = build("translate", TranslateInputs("The dog runs.", target="German"), tokenizer, adapter_on=True)
    assert prompt.text == "English: The dog runs.\nGerman:"


def test_summarize_prompt(tokenizer):
    prompt = build("summarize", SummarizeInputs("  A fox saw some grapes.\n"), tokenizer)
    assert prompt.text == "A fox saw some grapes.\nTL;DR:"
    assert prompt.ids == tokenizer.encode(prompt.text)
    assert build("summarize", SummarizeInputs("A fox saw some grapes."), tokenizer, adapter_on=True) == prompt


@pytest.mark.parametrize("name, inputs, target, completion", [
    ("dialogue", DialogueInputs("Hi", history=[("Hello", "Hey.")], persona="Bot is kind."), "Hi\nthere!",
     " Hi there!\n"),
    ("translate", TranslateInputs("The dog runs."), "Le chien court.", " Le chien court.\n"),
    ("summarize", SummarizeInputs("The fox could not reach the grapes, so he said they were sour."),
     "People scorn what they cannot have.", " People scorn what they cannot have.\n"),
])
def test_format_example_is_the_adapter_prompt_plus_a_one_line_completion(tokenizer, name, inputs, target,
                                                                         completion):
    prompt, got = TASKS[name].format_example(inputs, target)
    assert prompt == build(name, inputs, tokenizer, adapter_on=True).text
    assert got == completion


# --- fitting the context ----------------------------------------------------------------------

def test_dialogue_drops_oldest_turns_first(tokenizer):
    history = [("First question?", "First answer."), ("Second question?", "Second answer."),
               ("Third question?", "Third answer.")]
    inputs = DialogueInputs("Last question?", history=history, persona="Bot is terse.")
    needed = len(tokenizer.encode("Bot is terse.\nUser: Third question?\nBot: Third answer.\n"
                                  "User: Last question?\nBot:"))
    prompt = build("dialogue", inputs, tokenizer, max_prompt_tokens=needed)
    assert prompt.text == "Bot is terse.\nUser: Third question?\nBot: Third answer.\nUser: Last question?\nBot:"
    assert len(prompt.ids) <= needed
    assert prompt.notes == [Message.keyed("dropped_turns", count=2)]

    prompt = build("dialogue", inputs, tokenizer, max_prompt_tokens=needed - 1)
    assert prompt.text == "Bot is terse.\nUser: Last question?\nBot:"
    assert prompt.notes == [Message.keyed("dropped_turns", count=3)]


def test_the_next_prompt_of_a_conversation_is_the_one_a_run_sends_its_message_in(tokenizer):
    """next_prompt (the Chat tab's context line): with the message typed, the very prompt a run
    builds; with none typed yet, the same transcript ending in an empty message (which a run
    refuses), its oldest turns dropped to fit as a run would drop them."""
    history = [("First question?", "First answer."), ("Second question?", "Second answer.")]
    inputs = DialogueInputs("Last question?", history=history, persona="Bot is terse.")
    assert next_prompt(inputs, tokenizer, N_CTX, 16) == TASKS["dialogue"].prompt(inputs, tokenizer, N_CTX, 16, False)
    empty = replace(inputs, message="")
    prompt = next_prompt(empty, tokenizer, N_CTX, 16)
    assert prompt.text == ("Bot is terse.\nUser: First question?\nBot: First answer.\n"
                           "User: Second question?\nBot: Second answer.\nUser: \nBot:")
    assert prompt.ids == tokenizer.encode(prompt.text) and prompt.notes == []
    with refused("empty", name="message"):
        TASKS["dialogue"].prompt(empty, tokenizer, N_CTX, 16, False)
    longer = replace(empty, history=history * 6)
    fitted = next_prompt(longer, tokenizer, N_CTX, 64)  # the prompt keeps the context's first half
    assert len(fitted.ids) <= N_CTX // 2 and fitted.notes[0].key == "dropped_turns"
    assert fitted.notes[0] == TASKS["dialogue"].prompt(replace(longer, message="x"), tokenizer, N_CTX, 64, False).notes[0]


def test_dialogue_that_cannot_fit_persona_and_message_is_an_error(tokenizer):
    inputs = DialogueInputs("Last question?", history=[("Hi", "Hello")], persona="Bot is terse.")
    with pytest.raises(PromptTooLong) as too_long:
        build("dialogue", inputs, tokenizer, max_prompt_tokens=5)
    assert too_long.value.what == "the persona and the message" and too_long.value.room == 5


def test_translate_drops_examples_before_the_text(tokenizer):
    inputs = TranslateInputs("The dog runs.")
    last_pair_and_text = "We are reading a book in the garden. = Nous lisons un livre dans le jardin.\nThe dog runs. ="
    room = len(tokenizer.encode(last_pair_and_text))  # the last pair fits, not the one before it
    prompt = build("translate", inputs, tokenizer, max_prompt_tokens=room)
    assert len(prompt.ids) <= room
    assert prompt.text == last_pair_and_text
    assert prompt.notes and prompt.notes[0].key == "dropped_examples" and prompt.notes[0].field("total") == 4
    assert prompt.notes[0].field("count") == 3
    with pytest.raises(PromptTooLong) as too_long:
        build("translate", inputs, tokenizer, max_prompt_tokens=3)
    assert too_long.value.what == "the text to translate"


def test_summarize_cuts_a_long_article_and_keeps_tldr(tokenizer):
    article = " ".join(f"Sentence number {i} of a long article." for i in range(200))
    n_article = len(tokenizer.encode(article))
    prompt = build("summarize", SummarizeInputs(article), tokenizer, max_prompt_tokens=60)
    assert len(prompt.ids) <= 60
    assert prompt.text.startswith("Sentence number 0 of a long article.")
    assert prompt.text.endswith("\nTL;DR:")
    assert prompt.ids[-len(tokenizer.encode("\nTL;DR:")):] == tokenizer.encode("\nTL;DR:")
    assert prompt.notes == [Message.keyed("article_cut", room=60 - len(tokenizer.encode("\nTL;DR:")), tokens=n_article)]
    # A cut inside a character moves back to the last whole one: the article sent is a piece of it.
    article, tldr_tokens = "你好" * 20, len(tokenizer.encode("\nTL;DR:"))
    ids = tokenizer.encode(article)
    inside = next(n for n in range(len(ids) - 1, 0, -1) if tokenizer.token_bytes(ids[n])[0] & 0xC0 == 0x80)
    cut = build("summarize", SummarizeInputs(article), tokenizer, max_prompt_tokens=inside + tldr_tokens)
    kept = cut.text.removesuffix("\nTL;DR:")
    assert "\ufffd" not in kept and article.startswith(kept) and 0 < len(cut.ids) - tldr_tokens < inside
    assert cut.notes == [Message.keyed("article_cut", room=len(cut.ids) - tldr_tokens, tokens=len(ids))]


def test_a_cut_between_characters_keeps_a_token_each_side(tokenizer):
    from tasks.base import cut_between_characters

    ids = tokenizer.encode("🙂")  # one character, in tokens that split it
    assert len(ids) > 1 and tokenizer.starts_inside_a_character(ids[1])
    assert cut_between_characters(tokenizer, ids, 1, -1) == 1  # held at the start
    assert cut_between_characters(tokenizer, ids, len(ids) - 1, +1) == len(ids) - 1  # held at the end
    smile = tokenizer.encode("a🙂b")
    assert cut_between_characters(tokenizer, smile, 2, -1) == 1 and cut_between_characters(tokenizer, smile, 2, +1) \
        == len(smile) - 1
    for cut in (0, len(ids)):
        with pytest.raises(ValueError, match="must leave one on each side"):
            cut_between_characters(tokenizer, ids, cut, +1)


def test_generate_reads_the_newest_tokens_of_a_prompt_too_long(tokenizer):
    prompt = build("generate", GenerateInputs("one two three four five six"), tokenizer, max_prompt_tokens=5)
    assert prompt.ids == tokenizer.encode("one two three four five six")[-5:]
    assert prompt.text == " two three four five six"
    assert prompt.notes == [Message.keyed("prompt_cut", room=5, tokens=6)]
    # A cut inside a character moves to the next whole one: the text sent is a piece of the prompt.
    ids = tokenizer.encode("你好" * 6)
    inside = next(n for n in range(len(ids) - 1, 0, -1) if tokenizer.token_bytes(ids[-n])[0] & 0xC0 == 0x80)
    cut = build("generate", GenerateInputs("你好" * 6), tokenizer, max_prompt_tokens=inside)
    assert "\ufffd" not in cut.text and ("你好" * 6).endswith(cut.text) and len(cut.ids) < inside
    assert cut.notes == [Message.keyed("prompt_cut", room=len(cut.ids), tokens=len(ids))]
    fits = build("generate", GenerateInputs("one two three four five"), tokenizer, max_prompt_tokens=5)
    assert fits.text == "one two three four five" and fits.notes == []


# --- post-processing --------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (' Dr. Smith paid $3.50 for it. "Really?" she asked! Yes... it was. More.',
     'Dr. Smith paid $3.50 for it. "Really?" she asked!'),
    ("The U.S. team won, e.g. in Paris. J. R. R. Tolkien wrote it. Wait... what? No.",
     "The U.S. team won, e.g. in Paris. J. R. R. Tolkien wrote it. Wait..."),
    ("Headline\n\nFirst line. Second line (really.) Third.", "Headline\n\nFirst line. Second line (really.)"),
    (" Only two. Sentences here.", "Only two. Sentences here."),  # fewer than 3: all of it
    ("It rose by 3.", "It rose by 3."),
])
def test_first_three_sentences(text, expected):
    assert first_sentences(3)(text) == expected


def test_translation_keeps_the_first_sentence():
    assert TASKS["translate"].postprocess(" Le chien court. Il est content.") == "Le chien court."
    assert TASKS["translate"].postprocess(" Le chien court") == "Le chien court"


# --- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, inputs, field", [
    ("generate", GenerateInputs(""), "prompt"),
    ("dialogue", DialogueInputs("  \n", persona="Bot is kind."), "message"),
    ("translate", TranslateInputs("\t"), "text to translate"),
    ("summarize", SummarizeInputs(" "), "article"),
])
def test_empty_input_is_refused(tokenizer, name, inputs, field):
    with refused("empty", name=field):
        build(name, inputs, tokenizer)


def test_text_with_no_letters_is_neither_translated_nor_summarised(tokenizer):
    """The model would turn symbols into a confident sentence; a letter in any script is a word."""
    for symbols in ("@@@ ###", "42 !?", "🙂"):
        with refused("no_letters"):
            build("translate", TranslateInputs(symbols), tokenizer)
    for words in ("Où?", "你好", "a"):
        assert build("translate", TranslateInputs(words), tokenizer).ids
    # nor is a summary of none: the model would summarise something else
    for symbols in ("🙂🙂🙂", "@@@ ###"):
        with refused("no_letters_article"):
            build("summarize", SummarizeInputs(symbols), tokenizer)
    assert build("summarize", SummarizeInputs("你好。"), tokenizer).ids


def test_unsupported_language_pair_is_refused(tokenizer):
    with refused("languages", source="English", target="Klingon", languages="English, French, German"):
        build("translate", TranslateInputs("Hello.", target="Klingon"), tokenizer)


def test_max_new_tokens_as_long_as_the_context_leave_the_prompt_half_of_it(model, tokenizer):
    """Every max_new_tokens the app offers runs: the prompt keeps half the context, and the
    generation stops when the context is full, saying so."""
    half = "Hello" + " world" * (N_CTX // 2 - 1)
    assert len(tokenizer.encode(half)) == N_CTX // 2
    done = run(model, tokenizer, "generate", GenerateInputs(half), max_new_tokens=N_CTX, temperature=0)[-1]
    assert done.result.stop_reason == "context_full"
    assert done.result.prompt_tokens + done.result.generated_tokens == N_CTX
    # A longer prompt loses its oldest tokens to that half (Generate), or is refused with advice
    # that, taken, runs (a task whose prompt must fit whole).
    done = run(model, tokenizer, "generate", GenerateInputs(half + " world"), max_new_tokens=N_CTX, temperature=0)[-1]
    assert done.result.prompt_tokens == N_CTX // 2 and done.result.stop_reason == "context_full"
    # ... and says why half: what max_new_tokens keeps for the output (at most half the context), and
    # how to let the model read more.
    assert done.prompt.notes == [Message.keyed("prompt_cut", room=N_CTX // 2, tokens=N_CTX // 2 + 1),
                                 Message.keyed("output_room", reserved=N_CTX // 2, context=N_CTX)]
    done = run(model, tokenizer, "generate", GenerateInputs(half + " world"), max_new_tokens=8, temperature=0)[-1]
    assert done.prompt.notes == []
    text = "Hello" + " world" * (N_CTX // 2 + 4)
    needs = len(tokenizer.encode(f"{text} ="))  # what must fit: the line that asks (the examples may go)
    fits_with = N_CTX - needs
    with refused("too_long_shorten", what="the text to translate", tokens=needs, room=N_CTX // 2, most=fits_with):
        run(model, tokenizer, "translate", TranslateInputs(text), max_new_tokens=N_CTX)
    with refused("too_long_shorten"):
        run(model, tokenizer, "translate", TranslateInputs(text), max_new_tokens=fits_with + 1)
    done = run(model, tokenizer, "translate", TranslateInputs(text), max_new_tokens=fits_with)[-1]
    assert done.result.prompt_tokens == needs
    with refused("too_long_context", context=N_CTX):
        run(model, tokenizer, "translate", TranslateInputs(text * 2), max_new_tokens=1)


def test_inputs_of_another_task_are_refused(model, tokenizer):
    with pytest.raises(TypeError, match="the summarize task takes SummarizeInputs"):
        run(model, tokenizer, "summarize", GenerateInputs("Hello"))


# --- run_task end to end ----------------------------------------------------------------------

def test_run_task_streams_updates_then_done(model, tokenizer):
    inputs = DialogueInputs("Hello there", persona="Bot is kind.")
    events = run(model, tokenizer, "dialogue", inputs, max_new_tokens=12, seed=1)
    *updates, done = events
    assert updates and all(isinstance(u, TaskUpdate) for u in updates)
    assert isinstance(done, TaskDone)
    assert done.prompt.text == build("dialogue", inputs, tokenizer, N_CTX - 12).text
    assert done.result.prompt_tokens == len(done.prompt.ids)
    assert done.text == TASKS["dialogue"].postprocess(done.result.text) == updates[-1].text
    assert done.result.seed == 1


def test_a_chat_reply_is_one_line_of_the_transcript(model, tokenizer):
    """What the model writes past its reply's line is nobody's turn: the reply keeps the first line
    with text on it, and generation stops once that line has ended."""
    assert TASKS["dialogue"].postprocess(" Where do you want to stay?\nU-seworthy!\nBuarily.") == \
        "Where do you want to stay?"
    assert TASKS["dialogue"].postprocess("\n\n Hello there.\nUser") == "Hello there."
    written = tokenizer.encode(" Where do you want to stay?\nU-seworthy!")
    inputs = DialogueInputs("I need a room for two nights.", persona="Bot books hotels.")
    task = TASKS["dialogue"]
    *_, done = run_task(task, model, tokenizer, inputs, replace(task.defaults, max_new_tokens=30, seed=1),
                        forced=written)
    assert done.text == "Where do you want to stay?"
    assert done.result.stop_reason == "task_done" and done.result.generated_tokens == len(written) + 1


def test_run_task_same_seed_same_text(model, tokenizer):
    inputs = GenerateInputs("The meaning of life is")
    first = run(model, tokenizer, "generate", inputs, max_new_tokens=10, seed=7)[-1]
    second = run(model, tokenizer, "generate", inputs, max_new_tokens=10, seed=7)[-1]
    other = run(model, tokenizer, "generate", inputs, max_new_tokens=10, seed=8)[-1]
    assert first.text == second.text and first.result.token_ids == second.result.token_ids
    assert other.result.token_ids != first.result.token_ids


def test_run_task_applies_the_task_stop_strings(model, tokenizer):
    """A random model writes no speaker tags, so make one of its own words the task's stop string."""
    inputs = GenerateInputs("Hello")
    free = run(model, tokenizer, "generate", inputs, max_new_tokens=10, seed=3)[-1].result
    stop_word = tokenizer.decode(free.token_ids[4:5])
    task = replace(TASKS["generate"], defaults=replace(TASKS["generate"].defaults, stop=(stop_word,)))
    params = replace(task.defaults, max_new_tokens=10, seed=3, stop=())  # the caller sets no stop strings
    done = list(run_task(task, model, tokenizer, inputs, params))[-1]
    assert done.result.stop_reason == "stop_string"
    assert done.text == free.text[:free.text.index(stop_word)]


def test_run_task_stops_once_postprocess_has_cut_for_good(model, tokenizer):
    task = replace(TASKS["generate"], postprocess=lambda text: text[:5])
    params = replace(task.defaults, max_new_tokens=40, seed=5)
    *updates, done = run_task(task, model, tokenizer, GenerateInputs("Hello"), params)
    assert done.result.stop_reason == "task_done"
    assert done.result.generated_tokens < 40
    assert len(done.text) == 5 and done.text == done.result.text[:5] == updates[-1].text


def test_adapter_on_runs_the_task_adapter(model, tokenizer, tmp_path):
    """With the adapter on, run_task generates with the task's LoRA adapter (a real PEFT file); off,
    with the base model, as before."""
    import copy

    from model.adapters import load_adapter
    from engine.generate import generate

    with_adapter = copy.deepcopy(model)
    load_adapter(with_adapter, make_lora_adapter(model, tmp_path / "summarize"), "summarize")
    task = TASKS["summarize"]
    params = replace(task.defaults, temperature=0, max_new_tokens=8)
    inputs = SummarizeInputs("A fox saw some grapes.")
    on = list(run_task(task, with_adapter, tokenizer, inputs, params, adapter_on=True))[-1]
    off = list(run_task(task, with_adapter, tokenizer, inputs, params))[-1]
    assert off.result.token_ids == list(run_task(task, model, tokenizer, inputs, params))[-1].result.token_ids
    expected = generate(with_adapter, tokenizer, on.prompt.ids, replace(params, stop=("\n",)), adapter="summarize")
    assert on.result.token_ids == expected.token_ids != off.result.token_ids


def test_caller_cancel_stops_within_a_token_and_is_reported(model, tokenizer):
    cancel = threading.Event()
    task = TASKS["generate"]
    events = []
    params = replace(task.defaults, seed=4)
    for event in run_task(task, model, tokenizer, GenerateInputs("Hello"), params, cancel=cancel):
        events.append(event)
        cancel.set()  # right after the first update
    updates, done = events[:-1], events[-1]
    assert done.result.stop_reason == "cancelled"
    assert len(updates) == 1 and done.result.generated_tokens <= 3  # a stop-string prefix may be held back


def test_adapter_on_without_adapters_is_refused(model, tokenizer):
    with pytest.raises(ValueError, match="this model has no 'summarize' adapter"):
        list(run_task(TASKS["summarize"], model, tokenizer, SummarizeInputs("A fox."), TASKS["summarize"].defaults,
                      adapter_on=True))
    with refused("no_task_adapter", task="generate"):
        list(run_task(TASKS["generate"], model, tokenizer, GenerateInputs("Hi"), TASKS["generate"].defaults,
                      adapter_on=True))


def test_an_emptied_box_still_goes_through_english(model, tokenizer):
    """No pairs is no request for the direct translation (sent direct, French -> German came out in
    English): both steps go without pairs, each naming its languages, and say so once."""
    done = run(model, tokenizer, "translate", TranslateInputs("Le chat dort.", "French", "German", []), seed=1,
               max_new_tokens=20)[-1]
    first, second = done.prompt.text.split("\n\n")
    assert first == "français = English\nLe chat dort. =" and second.startswith("English = Deutsch\n")
    assert second.endswith(" =") and "\n" not in second.removeprefix("English = Deutsch\n")
    assert done.prompt.notes.count(NO_EXAMPLES) == 1
    assert any(note.key == "translated_through" and note.field("language") == "English" for note in done.prompt.notes)


def test_a_first_step_too_long_for_the_second_is_cut_to_fit(model, tokenizer):
    """The first step may write up to max_new_tokens without ending its sentence (sampled, this
    tiny model always does); that English, the app's and not the user's, is cut at its end to the
    room the second step leaves it, and the note says so, instead of a refusal that calls it the
    text to translate."""
    params = dict(seed=1, temperature=1.0, max_new_tokens=N_CTX // 2)
    first = run(model, tokenizer, "translate", TranslateInputs("Le chat dort.", "French", "English"), **params)[-1]
    *_, done = run(model, tokenizer, "translate", TranslateInputs("Le chat dort.", "French", "German"), **params)
    english_ids = tokenizer.encode(first.text)
    room = N_CTX - N_CTX // 2
    assert len(english_ids) + 1 > room  # " =" after the whole English would not fit
    cut = next(note for note in done.prompt.notes if note.key == "first_step_cut")
    kept = cut.field("kept")
    assert cut == Message.keyed("first_step_cut", kept=kept, tokens=len(english_ids)) and kept < len(english_ids)
    sent = tokenizer.decode(english_ids[:kept])
    assert done.prompt.text.split("\n\n")[1] == f"{sent} ="
    assert any(note.key == "translated_through" and note.field("text") == sent
               for note in done.prompt.notes)  # the English the second step was given
    assert len(done.prompt.ids) <= room and done.result.generated_tokens > 0
    # an English that fits is sent whole, with no such note
    *_, fits = run(model, tokenizer, "translate", TranslateInputs("Le chat dort.", "French", "German"),
                   **{**params, "max_new_tokens": 4})
    assert not any(note.key == "first_step_cut" for note in fits.prompt.notes)


def test_french_to_german_goes_through_english(model, tokenizer):
    """Neither side English: the text goes to English first, and that English to German, under the
    run's one seed; the prompt sent shows both steps, and a note the English in between."""
    first = run(model, tokenizer, "translate", TranslateInputs("Le chat dort.", "French", "English"), seed=1, max_new_tokens=20)[-1]
    assert first.text.strip()
    second = run(model, tokenizer, "translate", TranslateInputs(first.text, "English", "German"), seed=1, max_new_tokens=20)[-1]
    done = run(model, tokenizer, "translate", TranslateInputs("Le chat dort.", "French", "German"), seed=1, max_new_tokens=20)[-1]
    assert (done.text, done.prompt.ids, done.result.seed) == (second.text, second.prompt.ids, 1)
    assert done.prompt.text == f"{first.prompt.text}\n\n{second.prompt.text}"
    assert Message.keyed("translated_through", language="English", text=first.text, prompt=first.result.prompt_tokens,
                         generated=first.result.generated_tokens) in done.prompt.notes
    # the user's own example pairs ask for the direct translation; so do the pairs with English
    own = TranslateInputs("Le chat dort.", "French", "German", [("Un chat.", "Eine Katze.")])
    direct = run(model, tokenizer, "translate", own, seed=1, max_new_tokens=20)[-1]
    assert direct.prompt.text == build("translate", own, tokenizer).text and not direct.prompt.notes
    assert TASKS["translate"].two_steps(TranslateInputs("Le chat dort.", "French", "English"), True) is None
    # a language the app does not offer is refused as asked, not as the first step's pair
    with refused("languages", source="Spanish", target="German"):
        run(model, tokenizer, "translate", TranslateInputs("Hola.", "Spanish", "German"))
    # Stopped during the first step: no second step, and the note says the English was nothing
    stop = threading.Event()
    stop.set()
    task = TASKS["translate"]
    *_, stopped = run_task(task, model, tokenizer, TranslateInputs("Le chat dort.", "French", "German"),
                           replace(task.defaults, seed=1, max_new_tokens=20), cancel=stop)
    assert (stopped.text, stopped.result.stop_reason) == ("", "cancelled")
    assert stopped.prompt.text == first.prompt.text and any(
        note.key == "translated_through" and note.field("text") == "(nothing)" for note in stopped.prompt.notes)


# --- translation decoding: no loops -----------------------------------------------------------

def words_repeat(text: str, n: int = 3, times: int = 3) -> bool:
    """Whether some run of n words occurs `times` times: the mark of a loop."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return any(grams.count(gram) >= times for gram in set(grams))


def test_translation_defaults_break_a_loop_a_narrow_lead_would_keep():
    """History `la train de train de`: the loop's next token leads the scores by a little; greedy
    alone follows it, the task's defaults pick the new token."""
    defaults = TASKS["translate"].defaults
    assert defaults.greedy
    history = torch.tensor([[5, 3, 4, 3, 4]])
    logits = torch.zeros(1, 10)
    logits[0, 3], logits[0, 7] = 1.0, 0.9
    assert Sampler(replace(defaults, repetition_penalty=1.0), 0, torch.device("cpu"))(logits, history).item() == 3
    assert Sampler(defaults, 0, torch.device("cpu"))(logits, history).item() == 7


@pytest.fixture(scope="module")
def bundled():
    return load_pretrained()


def test_bundled_translation_does_not_loop(bundled):
    """The user's case: with the adapter on, greedy decoding wrote `Où est la train de train de ...`
    for all 64 tokens."""
    model, tokenizer = bundled
    task = TASKS["translate"]
    done = next(event for event in run_task(task, model, tokenizer, TranslateInputs(
        "Where is the train station?", "English", "French"), replace(task.defaults, seed=0), adapter_on=True)
        if isinstance(event, TaskDone))
    assert done.text and not words_repeat(done.text), done.text
    assert done.result.generated_tokens < task.defaults.max_new_tokens, done.text
