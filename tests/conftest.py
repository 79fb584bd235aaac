"""Shared fixtures: small real checkpoints in Hugging Face layout, built here with transformers."""
from __future__ import annotations

import functools
import json
import re
import shutil
import string
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO.parent / "shared" / "data"
GPT2_BPE = DATA_DIR / "gpt2-bpe"
ALL_PROJECTIONS = ("c_attn", "c_proj", "c_fc")


@pytest.fixture(scope="session")
def fresh_clone_startup() -> Iterator[Future]:
    """bench.startup's numbers for a fresh clone of HEAD with an empty kernel build cache, measured
    in a background thread (a Future)."""
    from bench import startup

    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(startup.seconds_to_first_answer, REPO, keep_build_cache=False)


def pytest_ignore_collect(collection_path, config):
    """For `-m "not slow"`, a module whose every test is slow (its pytestmark says so) is not even
    imported: the app's, the browser's and the training tests' imports (Gradio, Playwright) would
    take the fast tier a quarter of its time."""
    if config.getoption("markexpr") != "not slow" or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    whole_module = re.compile(r"^pytestmark = pytest\.mark\.(slow|browser)\b", re.M)
    return True if whole_module.search(collection_path.read_text(encoding="utf-8")) else None


def pytest_collection_modifyitems(items):
    """A browser test is a slow one too: `-m "not slow"` leaves it out."""
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def decode_kernels_built(request):
    """The decode kernels built before any test runs (the app builds them in the background): a
    test that compares a request alone with it in a crowd must not see them arrive in between.
    Where they cannot be built the tests run on PyTorch's path. A fresh clone that a test asks
    for starts first: its own build then runs beside this one (each compiler takes a core)
    rather than adding a minute after it. The fast tier (no slow test selected) decodes on
    PyTorch's path alone, with no build taking a core from it."""
    from engine import kernels

    if not any(item.get_closest_marker("slow") for item in request.session.items):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("STUDIO_DECODE_KERNELS", "0")
            yield
        return
    if any("fresh_clone_startup" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("fresh_clone_startup")
    kernels.wait_until_built()
    yield


def need_data(path: Path, what: str) -> Path:
    """`path` in the project's data (../shared/data), which only the tests of `what` need (GPT-2's
    own BPE vocabulary, the training data: files the repository may not hold); the test is skipped,
    saying so, where it is not there (a clone without the data beside it; CI has it)."""
    if not path.exists():
        pytest.skip(f"needs the project's data, {what}: {path} is not there")
    return path


@pytest.fixture(scope="session")
def pretraining_data() -> Path:
    """The training text (../shared/data/pretrain), which the tests that train or evaluate on it read."""
    return need_data(DATA_DIR / "pretrain", "the training data")


@pytest.fixture(scope="session")
def task_splits() -> dict[str, dict[str, list[dict]]]:
    """Every task's real splits (train.data.BUILDERS), built once: each takes seconds. Read only."""
    from train import data

    need_data(DATA_DIR, "the task splits' sources")
    return {task: build() for task, build in data.BUILDERS.items()}


def serving(loaded, quantize: str | None = None):
    """A (model, tokenizer) from load_pretrained as the app serves it (engine.prepare_for_serving)."""
    from engine import prepare_for_serving

    model, tokenizer = loaded
    return prepare_for_serving(model, quantize), tokenizer


def copy_of(model):
    """A plain GPT2 with the same config and weights (no adapters, no engine on it)."""
    from model import GPT2

    twin = GPT2(model.config).eval()
    twin.load_state_dict(model.state_dict())
    return twin


# Text to learn the small BPE's first merges from: the words the tests write, so that their prompts
# take a few tokens each, as in GPT-2, rather than one a byte; and Japanese characters, each a token
# of its own, as GPT-2's common ones are.
SMALL_BPE_TEXT = """Once upon a time, there was a little girl named Lily. She liked to play in the park.
Hello there! Hello world. The cat sat on the mat. The dog runs in the garden. Another request.
The meaning of life is to read a story. Then the fox saw some grapes, but they were sour.
User: Hi, who are you? Bot: I am a friendly bot. one two three four five six seven eight nine ten. It is ok,
word by word. The little bird sang.
日,本,語,の,テ,キ,ス,ト
I would like a cup of coffee. = Je voudrais une tasse de café. Der Hund läuft. Le chat dort.
"""


@functools.cache
def small_bpe(vocab_size: int = 50257) -> tuple[dict[str, int], str]:
    """A GPT-2-style byte-level BPE of `vocab_size` tokens, as (vocab.json's mapping, merges.txt's
    text), for checkpoints that need GPT-2's files but not GPT-2's own vocabulary (that is the
    project's data, which a clone from the host has not). As GPT-2's: the 256 byte tokens first,
    in GPT-2's order, then one token per merge, in merge order (merges learnt from SMALL_BPE_TEXT,
    then runs of letters to fill the vocabulary), and <|endoftext|> last. The fillers are not
    learnt, so transformers may split a word of them otherwise than tiktoken: the ids' match with
    transformers is tested on GPT-2's own vocabulary (tests/test_tokenizer.py)."""
    from collections import Counter

    import regex

    from model.tokenizer import END_OF_TEXT, GPT2_PATTERN, bytes_to_unicode

    byte_chars = list(bytes_to_unicode().values())
    vocab = {char: id for id, char in enumerate(byte_chars)}
    merges: list[tuple[str, str]] = []

    def merge(a: str, b: str) -> None:
        vocab[a + b] = len(vocab)
        merges.append((a, b))

    char_of = bytes_to_unicode()
    words = Counter(tuple(char_of[byte] for byte in word.encode()) for word in regex.findall(GPT2_PATTERN,
                                                                                            SMALL_BPE_TEXT))
    while len(vocab) < vocab_size - 1:
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                if pair[0] + pair[1] not in vocab:
                    pairs[pair] += count
        if not pairs:  # every word of the text is one token
            break
        a, b = min(pairs, key=lambda pair: (-pairs[pair], pair))  # the commonest; ties in a fixed order
        merge(a, b)
        merged = {}
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        words = merged
    # The rest: runs of ASCII letters, with a space before or not, shortest first. Tokens of text,
    # as GPT-2's mostly are; a pair of bytes of different characters would be none.
    letters = [char_of[byte] for byte in string.ascii_letters.encode()]
    stems = [char_of[ord(" ")], *letters]
    while len(vocab) < vocab_size - 1:
        longer = []
        for stem in stems:
            for letter in letters:
                if len(vocab) == vocab_size - 1:
                    break
                if stem + letter not in vocab:
                    merge(stem, letter)
                longer.append(stem + letter)
        stems = longer
    vocab[END_OF_TEXT] = len(vocab)
    return vocab, "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)


def write_small_bpe(directory: Path, vocab_size: int = 50257) -> None:
    """small_bpe's files, under the names HF checkpoints give GPT-2's."""
    vocab, merges_text = small_bpe(vocab_size)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "merges.txt").write_text(merges_text, encoding="utf-8")


def make_hf_checkpoint(directory: Path, seed: int = 0, weights: str = "safetensors", **config) -> Path:
    """A random-initialised transformers GPT2LMHeadModel saved with its own save_pretrained."""
    from transformers import GPT2Config as HFConfig, GPT2LMHeadModel

    torch.manual_seed(seed)
    config.setdefault("vocab_size", 50257)
    hf = GPT2LMHeadModel(HFConfig(**config)).eval()
    directory.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(directory)
    if weights == "bin":
        # transformers 5 only writes safetensors; a .bin checkpoint is the same tensors pickled.
        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        torch.save(state, directory / "pytorch_model.bin")
        (directory / "model.safetensors").unlink()
    write_small_bpe(directory, config["vocab_size"])
    return directory


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A small GPT-2 with a GPT-2-style tokenizer (small_bpe), for tests that need text in and out."""
    return make_hf_checkpoint(tmp_path_factory.mktemp("tiny"), n_positions=128, n_embd=64, n_layer=2, n_head=2)


def make_lora_adapter(base, directory: Path, seed: int = 0, r: int = 4,
                      targets: tuple[str, ...] = ALL_PROJECTIONS) -> Path:
    """A PEFT LoRA adapter for `base` (ours or transformers'), saved by PEFT itself.

    PEFT starts lora_B at zero (a no-op adapter); random B makes the adapter change the logits.
    """
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets)))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    peft_model.save_pretrained(directory)
    return directory


# --- the app ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def app_models(tmp_path_factory) -> list[str]:
    """What the app tests start the app with, in this order: a small GPT-2 with a context long enough
    for every task's defaults and LoRA adapters for dialogue (on by default), summarize and translate
    (c_attn only); a second model without adapters; and a directory that fails to load (no weights)."""
    root = tmp_path_factory.mktemp("app-models")
    with_adapters = make_checkpoint_with_adapters(
        root / "with-adapters", {"dialogue": ALL_PROJECTIONS, "summarize": ALL_PROJECTIONS, "translate": ("c_attn",)},
        n_positions=1024, n_embd=64, n_layer=2, n_head=2)
    from model.adapters import ON_BY_DEFAULT_FILE
    (with_adapters / "adapters" / ON_BY_DEFAULT_FILE).write_text('{"on": ["dialogue"]}')  # as the bundled model's
    plain = make_hf_checkpoint(root / "plain", seed=1, n_positions=256, n_embd=32, n_layer=1, n_head=2)
    broken = root / "broken"
    broken.mkdir()
    shutil.copy(plain / "config.json", broken)
    return [str(with_adapters), str(plain), str(broken)]


def values_for(api_name: str, **given) -> dict:
    """What a task's API call sends (serve/apis.py): its defaults, with `given`."""
    from serve.apis import APIS

    api = APIS[api_name]
    return {**{name: p.default for name, p in api.signature.parameters.items()}, **given}


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    """Poll `condition` until it holds (True) or timeout_s passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextmanager
def studio_app(models, api_key: str | None = None, **launch_options) -> Iterator[tuple]:
    """The app, as app.py builds and launches it, served on a free loopback port in this process;
    yields (its gr.Blocks, its URL). `models`: the names to start it with, or a host the test keeps
    to look inside (a ModelHost, or a RemoteHost in front of a deployment, which answers /v1 itself;
    its queue is the app's); `api_key`: the /v1 API's."""
    import app  # here, not at the top: only the app tests pay for importing Gradio
    from bench.load import free_port
    from serve.backend import RemoteHost
    from serve.model_host import ModelHost

    # loading allowed, as app.py has it where it is run by hand
    host = models if isinstance(models, (ModelHost, RemoteHost)) else ModelHost(models, device="cpu", allow_load=True)
    routes = app.v1_routes(host, api_key) if isinstance(host, ModelHost) else []
    demo = app.build_app(host)
    _, url, _ = app.launch(demo, models=host.names, routes=routes,
                           server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                           **launch_options)
    try:
        yield demo, url
    finally:
        demo.close()


@contextmanager
def serve_studio(models, **launch_options) -> Iterator[str]:
    """studio_app's URL."""
    with studio_app(models, **launch_options) as (_, url):
        yield url


@pytest.fixture(scope="module")
def studio_url(app_models) -> Iterator[str]:
    with serve_studio(app_models) as url:
        yield url


def make_checkpoint_with_adapters(directory: Path, adapters: dict[str, tuple[str, ...]] | None = None,
                                  **config) -> Path:
    """A small transformers GPT-2 checkpoint with PEFT adapters trained on its Conv1D layers
    ({task: target layers}); by default summarize on every projection, translate on c_attn only."""
    from transformers import GPT2LMHeadModel

    make_hf_checkpoint(directory, **config)
    hf = GPT2LMHeadModel.from_pretrained(directory)
    adapters = adapters or {"summarize": ALL_PROJECTIONS, "translate": ("c_attn",)}
    for seed, (task, targets) in enumerate(adapters.items(), start=1):
        make_lora_adapter(hf, directory / "adapters" / task, seed=seed, targets=targets)
    return directory


# The browser, for the UI tests: Debian's chromium (never `playwright install`).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = REPO / "test-output"
TIMEOUT_MS = 60_000  # a generation on a busy 2-core machine


@pytest.fixture(scope="session")
def adapter_checkpoint(tmp_path_factory):
    """A small GPT-2 with a GPT-2-style tokenizer (small_bpe) and two PEFT adapters."""
    return make_checkpoint_with_adapters(tmp_path_factory.mktemp("speed"), n_positions=128, n_embd=64, n_layer=2,
                                         n_head=2)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)  # a page's own default does not reach expect()'s 5 s

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_app(browser, url: str, locale: str = "en-US"):
    page = browser.new_context(locale=locale, viewport={"width": 1280, "height": 1200}, accept_downloads=True).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.wait_for_selector("#generate-run")
    return page


@pytest.fixture
def page(browser, studio_url):
    page = open_app(browser, studio_url)
    yield page
    page.context.close()


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)


@contextmanager
def refused(key: str, **fields):
    """A block that must be refused (tasks.messages.Refusal) with the message `key`, and these
    fields where given: what the user is told, as the code says it, before any rendering."""
    from tasks.messages import Refusal

    with pytest.raises(Refusal) as caught:
        yield caught
    message = caught.value.message
    assert message.key == key, message
    for name, value in fields.items():
        assert message.field(name) == value, message
