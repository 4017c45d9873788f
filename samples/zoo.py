"""The model zoo: real architectures built from transformers configs (random weights, no downloads, two
layers), ResNet-18 at full size and a MobileNet-style CNN in plain torch, with their dynamic dims, input makers, the sizes
tests check at and the sizes the benchmark measures. Used by tests/test_zoo.py and bench/zoo_models.py.
transformers is imported when a model is built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def _tf() -> Any:
    import transformers

    return transformers


VOCAB = 96
Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class ZooModel:
    build: Callable[[], torch.nn.Module]
    names: tuple[str, ...]  # the inputs, in order
    dims: dict[str, dict[int, tuple[str, int, int]]]  # input → axis → (dim name, min, max)
    make: Callable[[torch.Generator, tuple[int, ...]], Inputs]  # a batch at the given sizes
    samples: tuple[tuple[int, ...], ...]
    checks: tuple[tuple[int, ...], ...]  # unseen sizes, batch 1 and odd lengths among them
    bench: tuple[tuple[int, ...], ...] = ()  # the sizes bench/zoo_models.py measures

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        """`optimize`'s dynamic_shapes: one bladepack.Dim per dim name, shared by the axes naming it."""
        import bladepack

        dims: dict[str, Any] = {}
        for axes in self.dims.values():
            for name, lo, hi in axes.values():
                dims.setdefault(name, bladepack.Dim(name, lo, hi))
        return {n: {a: dims[d[0]] for a, d in self.dims.get(n, {}).items()} for n in self.names}


class Field(torch.nn.Module):
    """A Hugging Face model called with keyword inputs; one named field of its output."""

    def __init__(self, model: torch.nn.Module, keys: tuple[str, ...], field: str, **fixed: Any) -> None:
        super().__init__()
        self.model, self.keys, self.field, self.fixed = model, keys, field, fixed

    def call(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.keys, args)), **self.fixed)
        return getattr(out, self.field)  # type: ignore[no-any-return]


class Field1(Field):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(x)


class Field2(Field):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.call(ids, mask)


class Field3(Field):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        return self.call(ids, mask, dec)


def _field(model: torch.nn.Module, keys: tuple[str, ...], field: str, **fixed: Any) -> Field:
    cls = {1: Field1, 2: Field2, 3: Field3}[len(keys)]
    return cls(model, keys, field, **fixed).eval()


def _text(g: torch.Generator, size: tuple[int, ...]) -> Inputs:
    """Token ids and an attention mask whose first row is right-padded (never the whole row)."""
    b, t = size
    ids = torch.randint(3, VOCAB, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.int64)
    if b > 1:
        mask[0, (t + 1) // 2 :] = 0
    return ids, mask


def _seq2seq(g: torch.Generator, size: tuple[int, ...]) -> Inputs:
    b, t, u = size
    ids, mask = _text(g, (b, t))
    return ids, mask, torch.randint(3, VOCAB, (b, u), generator=g)


TEXT_DIMS = {"ids": {0: ("batch", 1, 16), 1: ("seq", 1, 64)}, "mask": {0: ("batch", 1, 16), 1: ("seq", 1, 64)}}
SEQ2SEQ_DIMS = {**TEXT_DIMS, "dec": {0: ("batch", 1, 16), 1: ("tgt", 1, 64)}}
TEXT_SAMPLES, TEXT_CHECKS = ((2, 9), (3, 12)), ((1, 1), (1, 6), (3, 7), (2, 13))
SEQ2SEQ_SAMPLES, SEQ2SEQ_CHECKS = ((2, 9, 5), (3, 12, 7)), ((1, 1, 1), (1, 6, 3), (3, 7, 11), (2, 13, 2))

DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    use_cache=False,
)


def _encoder(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        if name == "distilbert":
            cfg = _tf().DistilBertConfig(
                vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128
            )
            model = _tf().DistilBertModel(cfg)
        else:
            cfg = _tf().BertConfig(
                vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
            )
            model = _tf().BertModel(cfg, add_pooling_layer=False)
        return _field(model.eval(), ("input_ids", "attention_mask"), "last_hidden_state")

    return build


def _t5(full: bool) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        cfg = _tf().T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=20,
            decoder_start_token_id=0,
        )
        if not full:
            return _field(_tf().T5EncoderModel(cfg).eval(), ("input_ids", "attention_mask"), "last_hidden_state")
        keys = ("input_ids", "attention_mask", "decoder_input_ids")
        return _field(_tf().T5Model(cfg).eval(), keys, "last_hidden_state", use_cache=False)

    return build


# BART and Whisper's encoder-decoder sizes
ENCODER_DECODER = dict(
    vocab_size=VOCAB,
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
)


def _bart() -> torch.nn.Module:
    cfg = _tf().BartConfig(**ENCODER_DECODER, max_position_embeddings=128)
    keys = ("input_ids", "attention_mask", "decoder_input_ids")
    return _field(_tf().BartModel(cfg).eval(), keys, "last_hidden_state", use_cache=False)


def _decoder(config: str, model: str, **extra: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        cfg = getattr(_tf(), config)(**{**DECODER, **extra})
        net = getattr(_tf(), model)(cfg).eval()
        return _field(net, ("input_ids", "attention_mask"), "last_hidden_state", use_cache=False)

    return build


def _falcon() -> torch.nn.Module:
    cfg = _tf().FalconConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True, use_cache=False
    )
    return _field(_tf().FalconModel(cfg).eval(), ("input_ids", "attention_mask"), "last_hidden_state")


def _vit() -> torch.nn.Module:
    cfg = _tf().ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    model = _tf().ViTModel(cfg, add_pooling_layer=False).eval()
    return _field(model, ("pixel_values",), "last_hidden_state", interpolate_pos_encoding=True)


def _segformer() -> torch.nn.Module:
    """SegFormer's semantic segmentation: four stages of efficient self-attention (keys and values
    from a strided convolution, reduction 8 / 4 / 2 / 1), Mix-FFN's depthwise convolution, and the
    all-MLP decoder that resizes every stage to a quarter of the image."""
    cfg = _tf().SegformerConfig(
        num_encoder_blocks=4,
        depths=[1, 1, 1, 1],
        sr_ratios=[8, 4, 2, 1],
        hidden_sizes=[16, 32, 64, 128],
        num_attention_heads=[1, 2, 4, 8],
        decoder_hidden_size=64,
        num_labels=5,
    )
    return _field(_tf().SegformerForSemanticSegmentation(cfg).eval(), ("pixel_values",), "logits")


def _whisper() -> torch.nn.Module:
    cfg = _tf().WhisperConfig(
        **ENCODER_DECODER,
        num_mel_bins=16,
        max_source_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return _field(_tf().WhisperModel(cfg).get_encoder().eval(), ("input_features",), "last_hidden_state")


class InvertedResidual(torch.nn.Module):
    def __init__(self, c: int, expand: int) -> None:
        super().__init__()
        h = c * expand
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(c, h, 1, bias=False),
            torch.nn.BatchNorm2d(h),
            torch.nn.ReLU6(),
            torch.nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False),
            torch.nn.BatchNorm2d(h),
            torch.nn.Hardswish(),
            torch.nn.Conv2d(h, c, 1, bias=False),
            torch.nn.BatchNorm2d(c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class MobileNet(torch.nn.Module):
    """MobileNetV2 / V3 in miniature: a strided stem, inverted residuals with depthwise 3x3, a strided
    grouped downsampling, global pooling and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.Hardswish()
        )
        self.blocks = torch.nn.Sequential(InvertedResidual(16, 4), InvertedResidual(16, 4))
        self.down = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=16)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.hardsigmoid(self.down(self.blocks(self.stem(x))))
        return self.head(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def bn_statistics(model: torch.nn.Module, mean: float, var: tuple[float, float]) -> torch.nn.Module:
    """The model in eval mode with batch-norm statistics that are not the identity: running means in
    [-mean, mean], running variances in `var`."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-mean, mean)
                m.running_var.uniform_(*var)
    return model.eval()


def _mobilenet() -> torch.nn.Module:
    return bn_statistics(MobileNet(), 0.5, (0.5, 2.0))


class BasicBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = (
            torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(torch.nn.Module):
    """ResNet-18 as torchvision defines it (11.7M parameters, 1.8 GMAC at 224 x 224)."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            torch.nn.BatchNorm2d(64),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, 2, 1),
        )
        layers: list[torch.nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _resnet18() -> torch.nn.Module:
    return bn_statistics(ResNet18(), 0.1, (0.5, 1.5))


def _images(g: torch.Generator, size: tuple[int, ...]) -> Inputs:
    b, h, w = size
    return (torch.randn(b, 3, h, w, generator=g),)


def _features(g: torch.Generator, size: tuple[int, ...]) -> Inputs:
    (b,) = size
    return (torch.randn(b, 16, 64, generator=g),)


def _text_model(build: Callable[[], torch.nn.Module]) -> ZooModel:
    return ZooModel(build, ("ids", "mask"), TEXT_DIMS, _text, TEXT_SAMPLES, TEXT_CHECKS, ((1, 8), (4, 32), (16, 64)))


def _seq2seq_model(build: Callable[[], torch.nn.Module]) -> ZooModel:
    bench = ((1, 8, 4), (4, 32, 16), (16, 64, 32))
    return ZooModel(build, ("ids", "mask", "dec"), SEQ2SEQ_DIMS, _seq2seq, SEQ2SEQ_SAMPLES, SEQ2SEQ_CHECKS, bench)


IMAGE_DIMS = {"x": {0: ("batch", 1, 16), 2: ("height", 8, 96), 3: ("width", 8, 96)}}

ZOO: dict[str, ZooModel] = {
    "distilbert": _text_model(_encoder("distilbert")),
    "bert": _text_model(_encoder("bert")),
    "t5-encoder": _text_model(_t5(full=False)),
    "t5": _seq2seq_model(_t5(full=True)),
    "bart": _seq2seq_model(_bart),
    "qwen2": _text_model(_decoder("Qwen2Config", "Qwen2Model")),
    "llama": _text_model(_decoder("LlamaConfig", "LlamaModel")),
    "mistral": _text_model(_decoder("MistralConfig", "MistralModel")),
    "falcon": _text_model(_falcon),
    "vit": ZooModel(
        _vit,
        ("x",),
        IMAGE_DIMS,
        _images,
        ((2, 48, 40), (3, 40, 56)),
        ((1, 32, 32), (2, 24, 56), (1, 8, 72)),
        ((1, 32, 32), (4, 64, 48), (8, 96, 96)),
    ),
    "segformer": ZooModel(
        _segformer,
        ("x",),
        {"x": {0: ("batch", 1, 8), 2: ("height", 64, 512), 3: ("width", 64, 512)}},
        _images,
        ((2, 128, 128), (1, 96, 160)),
        ((1, 64, 64), (2, 97, 131), (1, 512, 77)),
        ((1, 128, 128), (4, 256, 256), (1, 512, 512)),
    ),
    "whisper-encoder": ZooModel(
        _whisper, ("x",), {"x": {0: ("batch", 1, 16)}}, _features, ((2,), (3,)), ((1,), (5,)), ((1,), (4,), (16,))
    ),
    "resnet18": ZooModel(
        _resnet18,
        ("x",),
        {"x": {0: ("batch", 1, 16), 2: ("height", 32, 256), 3: ("width", 32, 256)}},
        _images,
        ((2, 96, 96), (3, 128, 112)),
        ((1, 33, 47), (2, 64, 64), (1, 224, 224)),
        ((1, 96, 96), (1, 224, 224), (4, 128, 128)),
    ),
    "mobilenet": ZooModel(
        _mobilenet,
        ("x",),
        IMAGE_DIMS,
        _images,
        ((2, 32, 32), (3, 40, 24)),
        ((1, 17, 33), (2, 64, 9), (1, 8, 8)),
        ((1, 32, 32), (4, 64, 64), (8, 96, 96)),
    ),
}
