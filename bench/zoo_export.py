"""Exports a zoo of real architectures (torchvision, timm, Hugging Face transformers, torch.nn) to ONNX, with random
weights, for benchmarking whole-model tuning against onnxruntime.

Every model is built from its package's standard constructor or configuration
(no pretrained weights: nothing is downloaded), put in eval mode and exported
by torch's TorchScript exporter with static input shapes, each in its own
child process so that a crash or a hang loses only that model. Writes
OUT/<name>.onnx, OUT/manifest.json (per model: file, inputs, outputs, family,
source, or the error) and OUT/logs/<name>.log (the child's output). Runs in
its own environment (.venv-zoo, requirements-zoo.txt): torch never enters the
main one.

    .venv-zoo/bin/python bench/zoo_export.py --out bench/zoo [--only resnet50 bert_base] [--force]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

OPSET = 17
TIMEOUT_S = 300
RESULT_MARK = "ZOO_RESULT "
PACKAGES = ("torch", "torchvision", "timm", "transformers", "onnx")


class Built(NamedTuple):
    """A model ready to export: the module, its example inputs, their names, and the bound of integer inputs."""

    module: Any
    inputs: tuple[Any, ...]
    names: tuple[str, ...]
    high: int | None = None  # integer inputs (token ids) take values in [0, high)


@dataclass(frozen=True)
class Entry:
    """A registry entry: what kind of model it is, where its definition comes from, and how to build it."""

    family: str
    source: str
    build: Callable[[], Built]


# ---------------------------------------------------------------------------------------------------------------
# Inputs and wrappers (torch is imported inside functions: the parent process never loads it).


def _image(size: int = 224, frames: int | None = None) -> Any:
    """A random RGB image batch of one, NCHW (or a clip of frames, NCTHW)."""
    import torch

    return torch.randn(1, 3, size, size) if frames is None else torch.randn(1, 3, frames, size, size)


def _token_ids(vocab: int, length: int = 128) -> Any:
    """Random token ids, int64, batch one."""
    import torch

    return torch.randint(0, vocab, (1, length), dtype=torch.int64)


def _flatten(value: Any) -> tuple[Any, ...]:
    """The tensors of a nested output (tensor, tuple, list, dict, ModelOutput) in order; None and non-tensors dropped."""
    import torch

    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return tuple(t for v in value for t in _flatten(v))
    return ()


def _flat_module(module: Any) -> Any:
    """Wraps a module so that its outputs are a flat tuple of tensors (segmentation dicts, FPN maps, HF tuples)."""
    import torch

    class Flat(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: Any) -> tuple[Any, ...]:
            return _flatten(self.inner(*inputs))

    return Flat(module)


def _keyword_module(model: Any, names: tuple[str, ...], ones_mask: bool = False) -> Any:
    """Wraps a Hugging Face model to be called by keyword (its positional order differs by model and by version).

    With ones_mask, an all-ones attention_mask is made inside the graph: causal models otherwise trace a
    packed-sequence check (aten::diff) that the exporter cannot write.
    """
    import torch

    class Keywords(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: Any) -> Any:
            kwargs = dict(zip(names, inputs))
            if ones_mask:
                kwargs["attention_mask"] = torch.ones_like(inputs[0])
            return self.inner(**kwargs)

    return Keywords(model)


# ---------------------------------------------------------------------------------------------------------------
# Builders by source package.


def _torchvision(name: str, size: int = 224, frames: int | None = None, **kwargs: Any) -> Callable[[], Built]:
    """A torchvision model by its registered name, weights=None; frames makes the input a video clip."""

    def build() -> Built:
        import torchvision

        model = torchvision.models.get_model(name, weights=None, **kwargs)
        return Built(model, (_image(size, frames),), ("input",))

    return build


def _segmentation(name: str, size: int = 224) -> Callable[[], Built]:
    """A torchvision segmentation model without pretrained backbone or auxiliary head."""
    return _torchvision(name, size, weights_backbone=None, aux_loss=False)


def _timm(name: str, size: int = 224, reparameterize: bool = False) -> Callable[[], Built]:
    """A timm model by name, pretrained=False; reparameterize folds train-time branches (RepVGG) as for deployment."""

    def build() -> Built:
        import timm
        from timm.utils.model import reparameterize_model

        model, inputs = timm.create_model(name, pretrained=False).eval(), (_image(size),)
        if reparameterize:
            _calibrate_batch_norms(model, inputs)  # the branches' statistics, before they are folded
            model = reparameterize_model(model)
        return Built(model, inputs, ("input",))

    return build


def _transformers(model_class: str, config_class: str, inputs: str = "text", ones_mask: bool = False,
                  length: int = 128, size: int = 224, **config: Any) -> Callable[[], Built]:
    """A Hugging Face model built from its Config (never from_pretrained), eager attention, tuple outputs by default.

    inputs is "text" (input_ids of length), "image" (pixel_values of size) or "audio" (input_values, one second
    at 16 kHz).
    """

    def build() -> Built:
        import torch
        import transformers

        cfg = getattr(transformers, config_class)(**{"attn_implementation": "eager", "return_dict": False, **config})
        model = getattr(transformers, model_class)(cfg)
        if inputs == "text":
            example, name, high = _token_ids(cfg.vocab_size, length), "input_ids", cfg.vocab_size
        elif inputs == "image":
            example, name, high = _image(size), "pixel_values", None
        else:
            example, name, high = torch.randn(1, 16000), "input_values", None
        return Built(_keyword_module(model, (name,), ones_mask), (example,), (name,), high)

    return build


def _whisper_encoder() -> Built:
    """Whisper's encoder alone (the default WhisperConfig is whisper-tiny), over 30 s of 80-bin log-mel frames."""
    import torch
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = transformers.WhisperConfig(attn_implementation="eager", return_dict=False)
    names = ("input_features",)
    return Built(_keyword_module(WhisperEncoder(cfg), names), (torch.randn(1, cfg.num_mel_bins, 3000),), names)


def _resnet50_fpn() -> Built:
    """Faster R-CNN's ResNet-50 body (frozen batch norms) and FeaturePyramidNetwork: the five FPN maps, no heads."""
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    model = resnet_fpn_backbone(backbone_name="resnet50", weights=None, trainable_layers=5)
    return Built(model, (_image(512),), ("input",))


def _unet() -> Built:
    """The standard U-Net (Ronneberger et al.; milesial/Pytorch-UNet's layout): 64..1024 channels, ConvTranspose2d up."""
    import torch
    from torch import nn

    def double_conv(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    class Up(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
            self.conv = double_conv(cin, cout)

        def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
            return self.conv(torch.cat([skip, self.up(x)], dim=1))

    class UNet(nn.Module):
        def __init__(self, channels: int = 3, classes: int = 2) -> None:
            super().__init__()
            widths = (64, 128, 256, 512, 1024)
            self.inc = double_conv(channels, widths[0])
            self.downs = nn.ModuleList(nn.Sequential(nn.MaxPool2d(2), double_conv(a, b)) for a, b in itertools.pairwise(widths))
            self.ups = nn.ModuleList(Up(a, b) for a, b in itertools.pairwise(widths[::-1]))
            self.outc = nn.Conv2d(widths[0], classes, kernel_size=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            skips = [self.inc(x)]
            for down in self.downs:
                skips.append(down(skips[-1]))
            x = skips.pop()
            for up in self.ups:
                x = up(x, skips.pop())
            return self.outc(x)

    return Built(UNet(), (_image(256),), ("input",))


def _recurrent(kind: str, bidirectional: bool = False) -> Callable[[], Built]:
    """A sequence tagger: a 2-layer LSTM or GRU (hidden 128) over (1, 32, 64) features, a linear head on every step."""

    def build() -> Built:
        import torch
        from torch import nn

        class Tagger(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = getattr(nn, kind)(64, 128, num_layers=2, batch_first=True, bidirectional=bidirectional)
                self.head = nn.Linear(128 * (2 if bidirectional else 1), 10)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.head(self.rnn(x)[0])

        return Built(Tagger(), (torch.randn(1, 32, 64),), ("x",))

    return build


# ---------------------------------------------------------------------------------------------------------------
# The registry: name -> Entry. Configurations are the standard ones of the named published models.

TV = "torchvision.models"
HF = "transformers"

# roberta-base, albert-base-v2 and SmolLM-135M (a Llama) as published; their Config defaults are other sizes.
ROBERTA_BASE = {"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
                "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
ALBERT_BASE = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072, "embedding_size": 128}
SMOLLM_135M = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
               "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 2048,
               "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "use_cache": False}

MODELS: dict[str, Entry] = {
    # Convolutional classifiers (torchvision).
    "resnet18": Entry("cnn", f"{TV}.resnet18", _torchvision("resnet18")),
    "resnet50": Entry("cnn", f"{TV}.resnet50", _torchvision("resnet50")),
    "resnext50_32x4d": Entry("cnn", f"{TV}.resnext50_32x4d", _torchvision("resnext50_32x4d")),
    "wide_resnet50_2": Entry("cnn", f"{TV}.wide_resnet50_2", _torchvision("wide_resnet50_2")),
    "mobilenet_v2": Entry("cnn", f"{TV}.mobilenet_v2", _torchvision("mobilenet_v2")),
    "mobilenet_v3_large": Entry("cnn", f"{TV}.mobilenet_v3_large", _torchvision("mobilenet_v3_large")),
    "mobilenet_v3_small": Entry("cnn", f"{TV}.mobilenet_v3_small", _torchvision("mobilenet_v3_small")),
    "efficientnet_b0": Entry("cnn", f"{TV}.efficientnet_b0", _torchvision("efficientnet_b0")),
    "efficientnet_v2_s": Entry("cnn", f"{TV}.efficientnet_v2_s", _torchvision("efficientnet_v2_s")),
    "regnet_y_400mf": Entry("cnn", f"{TV}.regnet_y_400mf", _torchvision("regnet_y_400mf")),
    "convnext_tiny": Entry("cnn", f"{TV}.convnext_tiny", _torchvision("convnext_tiny")),
    "densenet121": Entry("cnn", f"{TV}.densenet121", _torchvision("densenet121")),
    "inception_v3": Entry("cnn", f"{TV}.inception_v3",
                          _torchvision("inception_v3", 299, aux_logits=False, init_weights=True)),
    "googlenet": Entry("cnn", f"{TV}.googlenet", _torchvision("googlenet", aux_logits=False, init_weights=True)),
    "shufflenet_v2_x1_0": Entry("cnn", f"{TV}.shufflenet_v2_x1_0", _torchvision("shufflenet_v2_x1_0")),
    "squeezenet1_1": Entry("cnn", f"{TV}.squeezenet1_1", _torchvision("squeezenet1_1")),
    "mnasnet1_0": Entry("cnn", f"{TV}.mnasnet1_0", _torchvision("mnasnet1_0")),
    "vgg11": Entry("cnn", f"{TV}.vgg11", _torchvision("vgg11")),
    "vgg16": Entry("cnn", f"{TV}.vgg16", _torchvision("vgg16")),
    "alexnet": Entry("cnn", f"{TV}.alexnet", _torchvision("alexnet")),
    # Vision transformers and hybrids (torchvision).
    "vit_b_16": Entry("vision-transformer", f"{TV}.vit_b_16", _torchvision("vit_b_16")),
    "swin_t": Entry("vision-transformer", f"{TV}.swin_t", _torchvision("swin_t")),
    "maxvit_t": Entry("vision-transformer", f"{TV}.maxvit_t", _torchvision("maxvit_t")),
    # Dense prediction, detection backbones, video (torchvision) and a U-Net written here.
    "deeplabv3_mobilenet_v3_large": Entry("segmentation", f"{TV}.segmentation.deeplabv3_mobilenet_v3_large",
                                          _segmentation("deeplabv3_mobilenet_v3_large", 512)),
    "fcn_resnet50": Entry("segmentation", f"{TV}.segmentation.fcn_resnet50", _segmentation("fcn_resnet50", 512)),
    "lraspp_mobilenet_v3_large": Entry("segmentation", f"{TV}.segmentation.lraspp_mobilenet_v3_large",
                                       _segmentation("lraspp_mobilenet_v3_large", 512)),
    "unet": Entry("segmentation", "code (U-Net, torch.nn)", _unet),
    "resnet50_fpn": Entry("detection-backbone", f"{TV}.detection.backbone_utils.resnet_fpn_backbone", _resnet50_fpn),
    "r3d_18": Entry("video", f"{TV}.video.r3d_18", _torchvision("r3d_18", 112, frames=16)),
    # timm.
    "deit_small": Entry("vision-transformer", "timm:deit_small_patch16_224", _timm("deit_small_patch16_224")),
    "mobilevit_s": Entry("vision-transformer", "timm:mobilevit_s", _timm("mobilevit_s", 256)),
    "efficientformer_l1": Entry("vision-transformer", "timm:efficientformer_l1", _timm("efficientformer_l1")),
    "levit_128s": Entry("vision-transformer", "timm:levit_128s", _timm("levit_128s")),
    "efficientvit_b0": Entry("vision-transformer", "timm:efficientvit_b0", _timm("efficientvit_b0")),
    "mixer_b16": Entry("mlp", "timm:mixer_b16_224", _timm("mixer_b16_224")),
    "repvgg_a2": Entry("cnn", "timm:repvgg_a2 (reparameterized)", _timm("repvgg_a2", reparameterize=True)),
    "ghostnet_100": Entry("cnn", "timm:ghostnet_100", _timm("ghostnet_100")),
    "cspdarknet53": Entry("cnn", "timm:cspdarknet53", _timm("cspdarknet53", 256)),
    "hrnet_w18_small": Entry("cnn", "timm:hrnet_w18_small", _timm("hrnet_w18_small")),
    "mixnet_s": Entry("cnn", "timm:mixnet_s", _timm("mixnet_s")),
    # Hugging Face transformers: text encoders, decoders, speech, CLIP, SegFormer.
    "bert_base": Entry("text-encoder", f"{HF}.BertModel", _transformers("BertModel", "BertConfig")),
    "distilbert": Entry("text-encoder", f"{HF}.DistilBertModel", _transformers("DistilBertModel", "DistilBertConfig")),
    "roberta_base": Entry("text-encoder", f"{HF}.RobertaModel",
                          _transformers("RobertaModel", "RobertaConfig", **ROBERTA_BASE)),
    "albert_base": Entry("text-encoder", f"{HF}.AlbertModel", _transformers("AlbertModel", "AlbertConfig", **ALBERT_BASE)),
    "mobilebert": Entry("text-encoder", f"{HF}.MobileBertModel", _transformers("MobileBertModel", "MobileBertConfig")),
    "t5_small_encoder": Entry("text-encoder", f"{HF}.T5EncoderModel", _transformers("T5EncoderModel", "T5Config")),
    "gpt2": Entry("text-decoder", f"{HF}.GPT2Model",
                  _transformers("GPT2Model", "GPT2Config", ones_mask=True, use_cache=False)),
    "llama_smollm_135m": Entry("text-decoder", f"{HF}.LlamaModel",
                               _transformers("LlamaModel", "LlamaConfig", ones_mask=True, **SMOLLM_135M)),
    "clip_vit_b32_text": Entry("text-encoder", f"{HF}.CLIPTextModel",
                               _transformers("CLIPTextModel", "CLIPTextConfig", length=77)),
    "clip_vit_b32_vision": Entry("vision-transformer", f"{HF}.CLIPVisionModel",
                                 _transformers("CLIPVisionModel", "CLIPVisionConfig", inputs="image")),
    "segformer_b0": Entry("segmentation", f"{HF}.SegformerForSemanticSegmentation",
                          _transformers("SegformerForSemanticSegmentation", "SegformerConfig", inputs="image", size=512,
                                        return_dict=True)),  # its head reads the encoder's outputs by name
    "whisper_tiny_encoder": Entry("speech", f"{HF}.models.whisper.modeling_whisper.WhisperEncoder", _whisper_encoder),
    "wav2vec2_base": Entry("speech", f"{HF}.Wav2Vec2Model", _transformers("Wav2Vec2Model", "Wav2Vec2Config", inputs="audio")),
    # Recurrent networks (torch.nn).
    "lstm": Entry("rnn", "torch.nn.LSTM", _recurrent("LSTM")),
    "bilstm": Entry("rnn", "torch.nn.LSTM (bidirectional)", _recurrent("LSTM", bidirectional=True)),
    "gru": Entry("rnn", "torch.nn.GRU", _recurrent("GRU")),
}


# ---------------------------------------------------------------------------------------------------------------
# Child: build and export one model.


def _one_line(error: BaseException | str) -> str:
    """An error as one short line for the manifest."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "unknown error")[:400]


def describe(path: Path) -> dict[str, Any]:
    """The inputs and outputs (name, static shape, numpy dtype) of an ONNX file, read without its weights."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}

    def values(items: Any) -> list[dict[str, Any]]:
        return [{"name": v.name, "shape": [d.dim_value if d.HasField("dim_value") else d.dim_param
                                           for d in v.type.tensor_type.shape.dim],
                 "dtype": helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name}
                for v in items if v.name not in initializers]

    return {"inputs": values(graph.input), "outputs": values(graph.output)}


def _randomize_zero_weights(module: Any) -> None:
    """Draws from N(0, 0.02) the weight tensors that the standard initialization leaves all zero (ViT's and
    Mixer's heads): a model whose output is zero whatever its input makes every check of its outputs vacuous."""
    for param in module.parameters():
        if param.dim() >= 2 and param.is_floating_point() and not param.any():
            param.normal_(0.0, 0.02)


def _calibrate_batch_norms(module: Any, inputs: tuple[Any, ...]) -> None:
    """Sets every batch norm's running statistics to those of the model's own activations on a random batch of 4.

    The defaults (mean 0, variance 1) are no normalization at all in eval mode: through a deep random network the
    activations then vanish or explode (EfficientNet's logits near 1e-14, Inception's near 1e12); trained
    networks keep them near unit scale, as these statistics do. Only the batch norms run in training mode.
    """
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    batch = tuple(torch.cat([x, torch.randn((3, *x.shape[1:]))]) if x.is_floating_point() else x.repeat_interleave(4, 0)
                  for x in inputs)
    module.eval()
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: this one batch's statistics
        norm.train()
    with torch.no_grad():
        module(*batch)
    module.eval()


def _set_output_shapes(path: Path, outputs: tuple[Any, ...]) -> None:
    """Writes the outputs' static shapes into the file where the exporter left a dimension symbolic (Swin's batch)."""
    import onnx

    model = onnx.load(str(path))
    for value, tensor in zip(model.graph.output, outputs):
        dims = value.type.tensor_type.shape.dim
        if [d.dim_value if d.HasField("dim_value") else None for d in dims] != list(tensor.shape):
            del dims[:]
            for size in tensor.shape:
                dims.add().dim_value = size
    onnx.save(model, str(path))


def export_one(name: str, out: Path, reference: bool = False) -> dict[str, Any]:
    """Builds the named model with random weights (seed 0), exports it to OUT/<name>.onnx and checks the file.

    With reference, OUT/<name>.reference.npz keeps the example inputs and torch's outputs (by their ONNX names).
    """
    import numpy as np
    import onnx
    import torch

    torch.manual_seed(0)
    torch.backends.mha.set_fastpath_enabled(False)  # nn.MultiheadAttention's fused inference kernel has no ONNX export
    started = time.perf_counter()
    built = MODELS[name].build()
    module = _flat_module(built.module).eval()
    path, partial = out / f"{name}.onnx", out / f"{name}.onnx.partial"
    with torch.no_grad():
        _randomize_zero_weights(module)
        _calibrate_batch_norms(module, built.inputs)
        outputs = module(*built.inputs)
        output_names = [f"output_{i}" for i in range(len(outputs))]
        torch.onnx.export(module, built.inputs, str(partial), dynamo=False, opset_version=OPSET,
                          input_names=list(built.names), output_names=output_names, do_constant_folding=True)
    if any(d["shape"] != list(t.shape) for d, t in zip(describe(partial)["outputs"], outputs)):
        _set_output_shapes(partial, outputs)
    onnx.checker.check_model(str(partial))
    os.replace(partial, path)
    if reference:
        arrays = zip([*built.names, *output_names], [*built.inputs, *outputs])
        np.savez(out / f"{name}.reference.npz", **{key: tensor.numpy() for key, tensor in arrays})
    info = describe(path)
    for spec in info["inputs"]:
        if built.high is not None and spec["dtype"].startswith("int"):
            spec["high"] = built.high
    if reference:
        info["reference"] = f"{name}.reference.npz"
    return {**info, "parameters": sum(p.numel() for p in built.module.parameters()),
            "bytes": path.stat().st_size, "export_seconds": round(time.perf_counter() - started, 1)}


def child_main(name: str, out: Path, reference: bool) -> int:
    """Runs export_one and prints its result (or the error) as one marked JSON line for the parent."""
    import warnings

    warnings.filterwarnings("ignore")
    try:
        result = export_one(name, out, reference)
    except Exception as error:  # noqa: BLE001 - any failure is reported in the manifest
        import traceback

        traceback.print_exc()
        (out / f"{name}.onnx.partial").unlink(missing_ok=True)
        result = {"error": _one_line(error)}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


# ---------------------------------------------------------------------------------------------------------------
# Parent: one child per model, the manifest.


def run_child(name: str, out: Path, timeout: float, reference: bool) -> dict[str, Any]:
    """Exports one model in a child process; its output goes to OUT/logs/<name>.log, a crash or hang to the error."""
    log = out / "logs" / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", str(out)]
    command += ["--reference"] if reference else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        (out / f"{name}.onnx.partial").unlink(missing_ok=True)
        captured = [text.decode(errors="replace") if isinstance(text, bytes) else text or "" for text in (expired.stdout, expired.stderr)]
        log.write_text("\n".join([*captured, f"timed out after {timeout:.0f} s\n"]))
        return {"error": f"timed out after {timeout:.0f} s"}
    log.write_text(done.stdout + "\n" + done.stderr)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = [line for line in done.stderr.splitlines() if line.strip()]
    return {"error": _one_line(f"child exited with code {done.returncode}: {tail[-1] if tail else 'no output'}")}


def load_manifest(path: Path) -> dict[str, Any]:
    """The manifest written before, or an empty one."""
    if path.exists():
        return json.loads(path.read_text())
    return {"models": {}}


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Writes the manifest atomically, models in registry order."""
    order = {name: i for i, name in enumerate(MODELS)}
    manifest["models"] = dict(sorted(manifest["models"].items(), key=lambda kv: order.get(kv[0], len(order))))
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(partial, path)


def package_versions() -> dict[str, str]:
    """Versions of the packages that define and export the models."""
    return {name: metadata.version(name) for name in PACKAGES}


def export_all(names: list[str], out: Path, force: bool, timeout: float, reference: bool = False) -> dict[str, Any]:
    """Exports each named model in turn (skipping files that exist unless force), updating the manifest after each."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = load_manifest(manifest_path)
    manifest.update({"opset": OPSET, "exporter": "torch.onnx.export(dynamo=False)", "packages": package_versions()})
    started = time.perf_counter()
    for name in names:
        entry, path = MODELS[name], out / f"{name}.onnx"
        base = {"file": path.name, "family": entry.family, "source": entry.source}
        previous = manifest["models"].get(name, {})
        if path.exists() and not force:
            result = previous if "error" not in previous and previous.get("inputs") else describe(path)
            print(f"{name:30s} exists, skipped", flush=True)
        else:
            path.unlink(missing_ok=True)
            result = run_child(name, out, timeout, reference)
            print(f"{name:30s} " + (f"FAILED {result['error']}" if "error" in result else
                                    f"{result['bytes'] / 2**20:8.1f} MiB {result['export_seconds']:6.1f} s"), flush=True)
        if "error" in result:
            base["file"] = None
        manifest["models"][name] = {**base, **{k: v for k, v in result.items() if k not in base}}
        write_manifest(manifest_path, manifest)
    failed = [name for name in names if "error" in manifest["models"][name]]
    print(f"{len(names) - len(failed)} of {len(names)} exported in {time.perf_counter() - started:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "zoo", help="output folder")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="export only these models")
    parser.add_argument("--force", action="store_true", help="export again models whose file exists")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds allowed to each model's export")
    parser.add_argument("--reference", action="store_true",
                        help="also write <name>.reference.npz: the example inputs and torch's outputs")
    parser.add_argument("--list", action="store_true", help="print the registry's names and exit")
    parser.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, args.out, args.reference)
    if args.list:
        print("\n".join(f"{name:30s} {entry.family:20s} {entry.source}" for name, entry in MODELS.items()))
        return 0
    unknown = sorted(set(args.only or ()) - set(MODELS))
    if unknown:
        sys.exit(f"unknown models: {', '.join(unknown)} (--list shows the registry)")
    names = [name for name in MODELS if not args.only or name in args.only]
    manifest = export_all(names, args.out, args.force, args.timeout, args.reference)
    return 1 if any("error" in manifest["models"][name] for name in names) else 0


if __name__ == "__main__":
    sys.exit(main())
