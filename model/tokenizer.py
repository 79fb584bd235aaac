"""One Tokenizer interface, two implementations.

GPT2BPETokenizer: GPT-2's byte-level BPE, run by tiktoken, built from a
checkpoint's own vocab.json + merges.txt (or OpenAI's encoder.json +
vocab.bpe, the same content), never from the network. It gives exactly the
ids of transformers' GPT2TokenizerFast, "<|endoftext|>" in text included.

SentencePieceTokenizer: the bundled model's tokenizer (byte-fallback BPE,
see train_sentencepiece). Its end-of-text token is the user-defined symbol
"<|endoftext|>", so it behaves like GPT-2's: the string "<|endoftext|>" in
text encodes to eos_id and eos_id decodes back to it.

Both decode through token_bytes (the raw bytes of one token), so decode and
the streaming decoder cannot disagree.
"""

import codecs
import io
import json
import re
from pathlib import Path
from typing import Callable, Iterable

import sentencepiece as spm
import tiktoken

END_OF_TEXT = "<|endoftext|>"
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_FILES = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))
SENTENCEPIECE_FILE = "tokenizer.model"
SENTENCEPIECE_SPACE = "▁"  # U+2581, how SentencePiece writes a space inside pieces
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class StreamDecoder:
    """Turns ids into text one at a time; never emits half a UTF-8 character."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self.token_bytes = token_bytes
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        """The text completed by this token ("" while a character is unfinished)."""
        return self.utf8.decode(self.token_bytes(id))

    def flush(self) -> str:
        """Whatever an unfinished character left over, as U+FFFD."""
        return self.utf8.decode(b"", final=True)


class Tokenizer:
    """Subclasses fill `token_table` (the bytes of every id) and implement encode and save."""
    name: str
    eos_id: int
    token_table: list[bytes]

    @property
    def vocab_size(self) -> int:
        return len(self.token_table)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def save(self, directory: Path) -> None:
        """Write the tokenizer's files into `directory`, as load_tokenizer reads them."""
        raise NotImplementedError

    def token_bytes(self, id: int) -> bytes:
        """Raw bytes of one token; b"" for control tokens."""
        if not 0 <= id < len(self.token_table):
            raise ValueError(f"token id {id} is out of range for {self.name} (vocab_size {self.vocab_size})")
        return self.token_table[id]

    def starts_inside_a_character(self, id: int) -> bool:
        """Whether a token starts with a UTF-8 continuation byte: byte-level pieces split characters,
        and a text cut just before such a token holds half a character on each side (U+FFFD)."""
        token = self.token_bytes(id)
        return bool(token) and 0x80 <= token[0] <= 0xBF

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(id) for id in ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self.token_bytes)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 src/encoder.py).

    Printable Latin-1 bytes stand for themselves; the others (control
    characters, space, ...) are shifted to characters from U+0100 on.
    """
    byte_values = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = byte_values[:]
    shifted = 0
    for byte in range(256):
        if byte not in byte_values:
            byte_values.append(byte)
            characters.append(256 + shifted)
            shifted += 1
    return dict(zip(byte_values, map(chr, characters)))


class GPT2BPETokenizer(Tokenizer):
    name = "gpt2-bpe"

    def __init__(self, vocab: dict[str, int], merges_text: str):
        byte_of = {character: byte for byte, character in bytes_to_unicode().items()}
        ranks = {bytes(byte_of[c] for c in token): id for token, id in vocab.items() if token != END_OF_TEXT}
        # tiktoken merges the adjacent pair whose result has the lowest rank; HF
        # applies merges in merges.txt order. With rank = id they agree as long as
        # ids grow in merge order, which holds for GPT-2 and models trained from it.
        merge_ids = [vocab.get("".join(line.split(" "))) for line in merges_text.splitlines()[1:] if line]
        if None in merge_ids or any(a >= b for a, b in zip(merge_ids, merge_ids[1:])):
            raise ValueError("merges do not follow vocab id order, so ids cannot serve as BPE ranks")
        self.eos_id = vocab[END_OF_TEXT]
        self.encoding = tiktoken.Encoding(name=self.name, pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                          special_tokens={END_OF_TEXT: self.eos_id})
        self.token_table = [b""] * (max(vocab.values()) + 1)
        for token_bytes, id in ranks.items():
            self.token_table[id] = token_bytes
        self.token_table[self.eos_id] = END_OF_TEXT.encode()
        self.vocab, self.merges_text = vocab, merges_text

    @classmethod
    def from_files(cls, vocab_json: Path, merges_txt: Path) -> "GPT2BPETokenizer":
        try:
            vocab = json.loads(Path(vocab_json).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read GPT-2 vocabulary {vocab_json}: {error}") from None
        if END_OF_TEXT not in vocab:
            raise ValueError(f"{vocab_json}: no {END_OF_TEXT} token; not a GPT-2 vocabulary")
        try:
            merges_text = Path(merges_txt).read_text(encoding="utf-8")
            return cls(vocab, merges_text)
        except (OSError, KeyError, ValueError) as error:
            raise ValueError(f"cannot build GPT-2 BPE from {vocab_json} + {merges_txt}: {error}") from None

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")

    def save(self, directory: Path) -> None:
        (Path(directory) / "vocab.json").write_text(json.dumps(self.vocab, ensure_ascii=False), encoding="utf-8")
        (Path(directory) / "merges.txt").write_text(self.merges_text, encoding="utf-8")


class SentencePieceTokenizer(Tokenizer):
    name = "sentencepiece"

    def __init__(self, processor: spm.SentencePieceProcessor):
        self.processor = processor
        self.eos_id = processor.piece_to_id(END_OF_TEXT)
        if processor.id_to_piece(self.eos_id) != END_OF_TEXT:
            raise ValueError(f"no {END_OF_TEXT} piece; expected a model made by train_sentencepiece")
        self.token_table = [self._piece_bytes(id) for id in range(processor.get_piece_size())]
        # SentencePiece writes a space as "▁", so a "▁" in the text would come
        # back as a space: encode sends each one as its three UTF-8 byte pieces.
        self.literal_space_ids = [processor.piece_to_id(f"<0x{byte:02X}>") for byte in SENTENCEPIECE_SPACE.encode()]

    def _piece_bytes(self, id: int) -> bytes:
        if self.processor.is_byte(id):  # "<0xAB>"
            return bytes([int(self.processor.id_to_piece(id)[3:5], 16)])
        if self.processor.is_control(id) or self.processor.is_unknown(id):
            return b""
        return self.processor.id_to_piece(id).replace(SENTENCEPIECE_SPACE, " ").encode()

    @classmethod
    def from_file(cls, model_path: Path) -> "SentencePieceTokenizer":
        try:
            return cls(spm.SentencePieceProcessor(model_proto=Path(model_path).read_bytes()))
        except (OSError, RuntimeError, ValueError) as error:
            raise ValueError(f"cannot load SentencePiece model {model_path}: {error}") from None

    def encode(self, text: str) -> list[int]:
        # A Python string may hold lone surrogates (JSON's "\ud800" decodes to one), which
        # SentencePiece cannot take; tiktoken reads each as U+FFFD, and so does this.
        text = LONE_SURROGATE.sub("\ufffd", text)
        if SENTENCEPIECE_SPACE not in text:
            return self.processor.encode(text, out_type=int)
        parts = self.processor.encode(text.split(SENTENCEPIECE_SPACE), out_type=int)
        return parts[0] + [id for part in parts[1:] for id in self.literal_space_ids + part]

    def save(self, directory: Path) -> None:
        (Path(directory) / SENTENCEPIECE_FILE).write_bytes(self.processor.serialized_model_proto())


def load_tokenizer(directory: Path) -> Tokenizer:
    """GPT-2 BPE from vocab.json + merges.txt (or encoder.json + vocab.bpe), else tokenizer.model."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer directory {directory} does not exist")
    for vocab_name, merges_name in GPT2_FILES:
        if (directory / vocab_name).is_file() and (directory / merges_name).is_file():
            return GPT2BPETokenizer.from_files(directory / vocab_name, directory / merges_name)
    if (directory / SENTENCEPIECE_FILE).is_file():
        return SentencePieceTokenizer.from_file(directory / SENTENCEPIECE_FILE)
    looked_for = [" + ".join(pair) for pair in GPT2_FILES] + [SENTENCEPIECE_FILE]
    raise FileNotFoundError(f"no tokenizer in {directory}: looked for {', '.join(looked_for)}")


# Every letter of English, French and German (and French's narrow no-break space) is a piece of
# its own, however rare in the training text: a letter left to byte fallback costs two tokens
# each time and shares its bytes with unrelated letters. Not below MIN_VOCAB_FOR_REQUIRED_CHARS:
# a toy vocabulary is too small to hold them next to the 256 byte pieces.
REQUIRED_CHARS = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                  "àâäæçéèêëîïôöœùûüÿÀÂÄÆÇÉÈÊËÎÏÔÖŒÙÛÜŸß«»\u202f")
MIN_VOCAB_FOR_REQUIRED_CHARS = 1024


def train_sentencepiece(texts: Iterable[str], out_prefix: Path, vocab_size: int) -> SentencePieceTokenizer:
    """Train a byte-fallback BPE whose decode(encode(s)) == s for any text; write <out_prefix>.model.

    Whitespace is kept exactly (identity normalisation, no dummy prefix, no
    whitespace collapsing), newline and tab are single-token symbols,
    characters too rare for 99.95% coverage, other than REQUIRED_CHARS, fall back to UTF-8 byte
    pieces.
    Texts are fed line by line (SentencePiece trains on "sentences").
    """
    def lines():
        for text in texts:
            yield from (line for line in text.split("\n") if line.strip())

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines(), model_writer=model, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=0.9995,
        required_chars=REQUIRED_CHARS if vocab_size >= MIN_VOCAB_FOR_REQUIRED_CHARS else "",
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
        split_digits=True, allow_whitespace_only_pieces=True,
        user_defined_symbols=[END_OF_TEXT, "\n", "\t"],
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        max_sentence_length=1 << 14, num_threads=2, minloglevel=2)
    out_path = Path(f"{out_prefix}.model")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(model.getvalue())
    return SentencePieceTokenizer.from_file(out_path)
