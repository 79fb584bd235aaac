"""int8 weights (engine/quantize.py): perplexity within 1% of fp32, adapters on top of them."""
from __future__ import annotations

import math

import pytest
import torch

from engine.quantize import BLOCK, GROUP, Int8Linear, pack, quantize_weights, rows_in_8_bits, unpack
from model import GPT2, GPT2Config, load_pretrained
from model.adapters import active_adapter
from train.pretrain import TrainSettings, mean_loss, random_windows, train

from .conftest import DATA_DIR, copy_of, need_data, serving

TINYSTORIES_VAL = DATA_DIR / "pretrain" / "tinystories" / "yuninxia_tinystories_val.txt"


@pytest.fixture(scope="module")
def byte_model_and_text():
    """A small GPT-2 trained here for 150 steps on TinyStories bytes, so that its perplexity
    means something (far below the 256 of guessing), and held-out text to measure it on."""
    text = need_data(TINYSTORIES_VAL, "TinyStories, to train on").read_bytes()[:300_000]
    data = torch.tensor(list(text), dtype=torch.int32)
    train_data, held_out = data[:250_000], data[250_000:]
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4))
    windows = torch.Generator().manual_seed(0)
    train(model, lambda step: random_windows(train_data, 16, 64, windows, "cpu"),
          TrainSettings(max_steps=150, lr=3e-3, warmup_steps=10, eval_every=10**9, save_every=10**9),
          log=lambda record: None, progress=False)
    return model.eval(), held_out


@pytest.mark.slow  # a model trained and measured on the data
def test_int8_perplexity_within_one_percent_of_fp32(byte_model_and_text):
    model, held_out = byte_model_and_text
    fp32_ppl = math.exp(mean_loss(model, held_out, 64, "cpu"))
    assert fp32_ppl < 20  # trained (guessing gives 256): the comparison below is between useful models
    quantized = quantize_weights(copy_of(model))
    assert not any(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    assert isinstance(quantized.lm_head, Int8Linear) and quantized.lm_head.weight.dtype == torch.int8
    assert quantized.transformer.wte.weight.dtype == torch.float32  # the embedding lookup stays fp32
    assert quantized.num_parameters() == model.num_parameters()
    int8_ppl = math.exp(mean_loss(quantized, held_out, 64, "cpu"))
    assert int8_ppl != fp32_ppl  # the weights really were rounded
    assert abs(int8_ppl / fp32_ppl - 1) < 0.01


def test_an_unknown_quantization_is_refused(adapter_checkpoint):
    model, _ = load_pretrained(adapter_checkpoint)
    with pytest.raises(ValueError, match="unknown quantization 'int4'; known: int8"):
        quantize_weights(model, "int4")


@torch.no_grad()
def test_adapters_work_on_the_int8_model(adapter_checkpoint):
    """LoRA stays in floating point on top of the int8 base (the adapters' hooks move to the
    quantized layers): off gives the int8 base exactly, and on changes the int8 model's logits as
    it changes the fp32 model's, up to the rounding."""
    fp32, _ = load_pretrained(adapter_checkpoint)
    int8, _ = serving(load_pretrained(adapter_checkpoint), quantize="int8")
    ids = torch.randint(0, fp32.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    base, _ = serving((copy_of(fp32), None), quantize="int8")  # the same int8 weights, served, no adapter on
    off_int8, off_fp32 = int8(ids), fp32(ids)
    assert torch.equal(off_int8, base(ids))
    for name in ("summarize", "translate"):
        with active_adapter(name):
            change_int8, change_fp32 = int8(ids) - off_int8, fp32(ids) - off_fp32
        assert (change_int8 - change_fp32).norm() < 0.1 * change_fp32.norm()




def test_each_group_of_inputs_is_rounded_to_8_bits_on_its_own_scale():
    """rows_in_8_bits, the inputs as the int8 kernel multiplies them: every value within half a
    step of its group's scale (max|x| / 127) of where it was, so an outlier coarsens its own group
    of GROUP values only; a NaN makes NaN of its group alone."""
    x = torch.randn(3, 3 * GROUP + 10, generator=torch.Generator().manual_seed(0))
    x[0, GROUP + 5] = 1000.0
    x[2, 2 * GROUP] = float("nan")
    rounded = rows_in_8_bits(x)
    assert rounded.shape == x.shape
    for start in range(0, x.shape[1], GROUP):
        group, got = x[:2, start:start + GROUP], rounded[:2, start:start + GROUP]
        step = group.abs().amax(dim=1, keepdim=True) / 127
        assert ((got - group).abs() <= step / 2 * (1 + 1e-6)).all()
        assert torch.equal(torch.round(got / step), torch.round(group / step))  # whole steps
    assert (rounded[0, :GROUP] - x[0, :GROUP]).abs().max() < 0.02  # the outlier's neighbours keep their precision
    assert rounded[2, 2 * GROUP:3 * GROUP].isnan().all() and not rounded[2, :2 * GROUP].isnan().any()


def test_a_packed_weight_holds_each_channels_four_bytes_where_the_kernel_reads_them():
    """pack's order, written out: block b's 16 channels, for inputs 4i..4i + 3, are the 64 bytes
    at (b * in / 4 + i) * 64, channel c's at + 4c; the channels past the last block follow row by
    row; every byte is stored plus 128. unpack gives the weight back."""
    out, width = 2 * BLOCK + 3, 2 * GROUP
    weight = torch.randint(-128, 128, (out, width), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    stored = pack(weight).flatten().view(torch.uint8).long()
    for o, i in [(0, 0), (5, 7), (BLOCK + 15, width - 1), (BLOCK, 64)]:
        b, c = divmod(o, BLOCK)
        assert stored[(b * width // 4 + i // 4) * 64 + 4 * c + i % 4] == int(weight[o, i]) + 128
    for o in range(2 * BLOCK, out):
        assert torch.equal(stored[o * width:(o + 1) * width], weight[o].long() + 128)
    assert torch.equal(unpack(pack(weight)), weight)


def test_a_layer_packs_its_weight_for_the_kernels_only_where_groups_of_64_divide_its_inputs():
    """Row by row as made (PyTorch's product, a GPU); packed in place when the CPU kernels are
    installed, and the same product either way."""
    generator = torch.Generator().manual_seed(0)
    for width, packed in [(GROUP * 3, True), (GROUP + 8, False)]:
        fp32 = torch.randn(20, width, generator=generator)
        layer = Int8Linear(fp32, None)
        x = torch.randn(3, width, generator=generator)
        row_by_row = layer(x)
        assert not layer.packed and torch.equal(layer.rows(), layer.weight)
        layer.pack_for_kernels()
        assert layer.packed == packed and layer.weight.shape == (20, width)
        assert (layer.rows().float() * layer.scale[:, None] - fp32).abs().max() <= layer.scale.max() / 2
        assert (layer(x) - row_by_row).abs().max() <= 1e-5 * row_by_row.abs().max()

