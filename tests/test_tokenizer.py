"""The tokenizers: GPT-2 BPE must match transformers id for id; both must round-trip any text."""

import shutil
from pathlib import Path

import pytest

from model.tokenizer import (END_OF_TEXT, GPT2BPETokenizer, SentencePieceTokenizer, load_tokenizer,
                             train_sentencepiece)

from .conftest import GPT2_BPE, need_data, write_small_bpe

TEXTS = [
    "Hello world",
    "  leading and trailing spaces  ",
    "café, naïve, Ünïcödé, Ærøskøbing, señor",
    "日本語のテキストと中文",
    "emoji 🙂👍🏽 and a family 👨‍👩‍👧 (joined by U+200D)",
    "def f(x):\n\treturn x  +  1  # code\n\n\n",
    "runs of     spaces,\t\ttabs\tand\n\n\nnewlines\r\nCRLF",
    f"one story{END_OF_TEXT}another {END_OF_TEXT} third",
    "I'm sure we'll see they've said it's 'quoted'",
    "1234567 + 3.14159 = 1234570.14159",
    "Le garçon a mangé la crème brûlée. Die Straße ist schön, Größe!",
    " ",
    "\n",
    "",
]
# "🙂" is one character of four UTF-8 bytes; byte-level BPE splits such characters over tokens.
STREAM_TEXT = "日本🙂é"


# GPT-2's own BPE is the project's data (../shared/data), not the repository's: only the tests of
# that vocabulary need it. The rest of GPT2BPETokenizer's behaviour is tested on small_bpe, built here.
GPT2_OWN_BPE = "GPT-2's own BPE vocabulary"


@pytest.fixture(scope="module")
def gpt2():
    return GPT2BPETokenizer.from_files(need_data(GPT2_BPE / "encoder.json", GPT2_OWN_BPE),
                                       need_data(GPT2_BPE / "vocab.bpe", GPT2_OWN_BPE))


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    import transformers
    directory = tmp_path_factory.mktemp("hf_gpt2")  # HF's file names, as in a GPT-2 checkpoint
    shutil.copy(need_data(GPT2_BPE / "encoder.json", GPT2_OWN_BPE), directory / "vocab.json")
    shutil.copy(need_data(GPT2_BPE / "vocab.bpe", GPT2_OWN_BPE), directory / "merges.txt")
    return transformers.GPT2TokenizerFast.from_pretrained(directory)


@pytest.fixture(scope="module")
def small_directory(tmp_path_factory) -> Path:
    """small_bpe's vocab.json + merges.txt, as a GPT-2 checkpoint holds them."""
    directory = tmp_path_factory.mktemp("small_bpe")
    write_small_bpe(directory)
    return directory


@pytest.fixture(scope="module")
def small(small_directory):
    return load_tokenizer(small_directory)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    text = ("Once upon a time, there was a little girl named Lily. She liked to play in the park.\n"
            "Le petit chat dort sur la table. Der kleine Hund spielt im Garten. 2024 was fun!\n") * 30
    return train_sentencepiece([text], tmp_path_factory.mktemp("spm") / "tiny", vocab_size=300)


def assert_streams_whole_characters(tokenizer, text):
    ids = tokenizer.encode(text)
    decoder = tokenizer.stream_decoder()
    pieces = [decoder.push(id) for id in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    # The test can only fail if some token ends inside a character.
    token_bytes = [tokenizer.token_bytes(id) for id in ids]
    assert any(not _is_complete_utf8(b) for b in token_bytes), "no token splits a character"
    assert "" in pieces[:-1]  # a token that ends mid-character emits nothing yet


def _is_complete_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_matches_transformers(gpt2, hf_gpt2, text):
    ids = gpt2.encode(text)
    assert ids == hf_gpt2(text)["input_ids"]
    assert gpt2.decode(ids) == text


def test_gpt2_special_tokens(gpt2):
    assert (gpt2.name, gpt2.vocab_size, gpt2.eos_id) == ("gpt2-bpe", 50257, 50256)
    assert gpt2.encode(END_OF_TEXT) == [50256]
    assert gpt2.token_bytes(50256) == END_OF_TEXT.encode()
    assert gpt2.token_bytes(gpt2.encode(" the")[0]) == b" the"
    with pytest.raises(ValueError, match="out of range"):
        gpt2.token_bytes(50257)


def test_a_gpt2_style_bpe_streams_whole_characters(small):
    assert (small.name, small.vocab_size, small.eos_id) == ("gpt2-bpe", 50257, 50256)
    assert_streams_whole_characters(small, STREAM_TEXT)


def test_a_gpt2_style_bpe_saves_and_loads(small, tmp_path):
    small.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.txt", "vocab.json"]
    reloaded = load_tokenizer(tmp_path)
    assert isinstance(reloaded, GPT2BPETokenizer)
    assert reloaded.encode(TEXTS[4]) == small.encode(TEXTS[4])


def test_a_gpt2_style_bpe_rejects_merges_out_of_id_order(small_directory, tmp_path):
    lines = (small_directory / "merges.txt").read_text(encoding="utf-8").splitlines()
    lines[1], lines[2] = lines[2], lines[1]
    (tmp_path / "merges.txt").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match="merges.txt"):
        GPT2BPETokenizer.from_files(small_directory / "vocab.json", tmp_path / "merges.txt")


@pytest.mark.parametrize("text", TEXTS + ["a literal ▁ (U+2581) and ▁▁", "\x00\x7f\u200b"])
def test_sentencepiece_round_trips(sentencepiece, text):
    assert sentencepiece.decode(sentencepiece.encode(text)) == text


def test_sentencepiece_pieces(sentencepiece):
    processor = sentencepiece.processor
    assert (sentencepiece.name, sentencepiece.vocab_size) == ("sentencepiece", 300)
    assert sentencepiece.encode(END_OF_TEXT) == [sentencepiece.eos_id]
    assert sentencepiece.token_bytes(processor.piece_to_id("<0xE6>")) == b"\xe6"
    assert sentencepiece.token_bytes(processor.unk_id()) == b""
    assert sentencepiece.encode("\n") == [processor.piece_to_id("\n")]
    space_piece = next(id for id in range(300) if processor.id_to_piece(id).startswith("▁"))
    assert sentencepiece.token_bytes(space_piece).startswith(b" ")


def test_sentencepiece_streams_whole_characters(sentencepiece):
    assert_streams_whole_characters(sentencepiece, STREAM_TEXT)


def test_sentencepiece_save_and_load(sentencepiece, tmp_path):
    sentencepiece.save(tmp_path)
    reloaded = load_tokenizer(tmp_path)
    assert isinstance(reloaded, SentencePieceTokenizer)
    assert reloaded.encode(TEXTS[2]) == sentencepiece.encode(TEXTS[2])


def test_bundled_tokenizer_loads():
    assets = Path(__file__).resolve().parent.parent / "assets"
    tokenizer = SentencePieceTokenizer.from_file(assets / "tokenizer.model")
    text = "Once upon a time, Lily said: « Bonjour ! » 🙂\n\tThe end."
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_load_tokenizer_errors(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist"):
        load_tokenizer(missing)
    with pytest.raises(FileNotFoundError) as error:
        load_tokenizer(tmp_path)
    assert str(tmp_path) in str(error.value)
    assert all(name in str(error.value) for name in ("vocab.json", "merges.txt", "tokenizer.model"))
    (tmp_path / "tokenizer.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="tokenizer.model"):
        load_tokenizer(tmp_path)
