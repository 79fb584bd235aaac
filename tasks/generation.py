"""Open generation: the prompt exactly as written (its newest tokens, where it does not fit), sampled
with top-k 40 as in the GPT-2 paper's samples."""
from __future__ import annotations

from dataclasses import dataclass

from engine.generate import SamplingParams
from model.tokenizer import Tokenizer

from .base import Prompt, Task, cut_between_characters, require_text
from .messages import Message


@dataclass(frozen=True)
class GenerateInputs:
    prompt: str


def build_prompt(inputs: GenerateInputs, tokenizer: Tokenizer, max_prompt_tokens: int, adapter_on: bool) -> Prompt:
    require_text(inputs.prompt, "prompt")
    # Not stripped: a trailing space or newline is part of what the user asks to continue.
    ids = tokenizer.encode(inputs.prompt)
    if len(ids) <= max_prompt_tokens:
        return Prompt(inputs.prompt, ids)
    # Too long: the model reads the newest text, as a notebook that goes on Continuing needs (the
    # oldest goes first, as Chat drops its oldest turns); the prompt box keeps all of it.
    kept = ids[cut_between_characters(tokenizer, ids, len(ids) - max_prompt_tokens, +1):]
    return Prompt(tokenizer.decode(kept), kept,
                  [Message.keyed("prompt_cut", room=len(kept), tokens=len(ids))])


GENERATE = Task(
    name="generate", title="Generate", inputs=GenerateInputs, build_prompt=build_prompt,
    # At least one token: at a story's end the model's next token is nearly always its end of
    # text, and Generate (or Continue) would give nothing back however often it was asked.
    defaults=SamplingParams(top_k=40, max_new_tokens=100, min_new_tokens=1),
    postprocess=lambda text: text,  # shown exactly as generated
)
