"""The model zoo: small configurations of real architectures, as memoplan specs.

Every factory builds its model from a configuration (random weights: nothing is downloaded,
nothing is read from the network), small enough for a CPU step of a few tens of milliseconds,
and shaped so that the activations, not the parameters and their gradients, make most of the
training step's peak, as they do in training at full size (a long sequence or a large image on a
narrow model), with ``use_cache=False`` (a transformers model in training keeps no key-value
cache).  ``ZOO`` lists them with their library and example; a plan names one as
``benchmarks/zoo_models.py:gpt2`` and its example as written in ``ZOO``.

Libraries: transformers and SpikingJelly (installed by the Makefile with memoplan's test
extras), and torchvision, timm and diffusers.  The Python package index's torchvision wheel is
built against the CUDA build of torch: with the CPU build its C++ operators (``nms``,
``roi_align``, ...) do not load, and importing it fails (it registers a fake kernel for ``nms``
without checking that the operator exists), which would also break transformers, which imports
torchvision whenever it can find it.  So the Makefile installs these three, and the few pure
Python packages diffusers needs, into a folder of their own, ``.venv/zoo`` (``pip install
--no-deps --target``), off the default import path; :func:`vision_packages` puts that folder at
the end of ``sys.path`` for the zoo's models only and, when torchvision's operators do not load,
declares the two operator schemas its import registers fake kernels for (no model here calls an
operator of torchvision's library).  ``MEMOPLAN_ZOO_PACKAGES`` names another folder.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memoplan.specs import Example

__all__ = ["ZOO", "Entry", "missing", "vision_packages"]


@dataclass(frozen=True)
class Entry:
    """One architecture of the zoo: its factory's name in this file, library and example spec."""

    name: str
    library: str
    example: str

    @property
    def model_spec(self) -> str:
        return f"{Path(__file__).as_posix()}:{self.name}"


def _entries(library: str, example: str, *names: str) -> list[Entry]:
    return [Entry(name, library, example) for name in names]


_HERE = Path(__file__).as_posix()
VOCAB = 256
TOKENS = "randint(4, 128, high=256)"  # batch 4, 128 tokens: attention and MLP activations dominate
IMAGES = "randn(8, 3, 64, 64)"

ZOO: tuple[Entry, ...] = (
    *_entries("transformers", TOKENS, "gpt2", "bert", "llama", "mistral", "qwen2", "mixtral", "gpt_neox"),
    *_entries("transformers", TOKENS, "opt", "phi", "gemma"),
    Entry("t5", "transformers", f"{_HERE}:t5_example"),
    Entry("whisper", "transformers", f"{_HERE}:whisper_example"),
    Entry("vit", "transformers", "randn(8, 3, 64, 64)"),
    Entry("mamba", "transformers", "randint(4, 64, high=256)"),
    *_entries("timm", IMAGES, "timm_vit", "timm_convnext", "timm_mobilenetv3"),
    Entry("tv_resnet", "torchvision", "randn(8, 3, 128, 128)"),  # its widths are fixed: a larger image
    *_entries("torchvision", IMAGES, "tv_mobilenet_v2", "tv_swin", "tv_vit"),
    Entry("unet2d", "diffusers", f"{_HERE}:unet2d_example"),
    Entry("unet2d_condition", "diffusers", f"{_HERE}:unet2d_condition_example"),
    Entry("spiking_cnn", "spikingjelly", "randn(4, 8, 1, 32, 32)"),
    Entry("spiking_mlp", "spikingjelly", "randn(8, 16, 256)"),
)

#: The module each library is imported as.
MODULES = {
    "transformers": "transformers",
    "timm": "timm",
    "torchvision": "torchvision",
    "diffusers": "diffusers",
    "spikingjelly": "spikingjelly",
}


# ---------------------------------------------------------------- the vision and diffusion packages


def _zoo_folder() -> Path:
    return Path(os.environ.get("MEMOPLAN_ZOO_PACKAGES") or Path(sys.prefix) / "zoo")


_DECLARED: list[Any] = []  # the torch.library fragment that declares torchvision's schemas, kept alive


def _declared(name: str) -> bool:
    """Whether the operator ``name`` exists (this file may be loaded more than once in a process)."""
    try:
        torch._C._dispatch_find_schema_or_throw(name, "")
    except RuntimeError:
        return False
    return True


def vision_packages() -> None:
    """Make torchvision, timm and diffusers importable (see the module's documentation)."""
    folder = _zoo_folder()
    if importlib.util.find_spec("torchvision") is None and folder.is_dir() and str(folder) not in sys.path:
        sys.path.append(str(folder))
        importlib.invalidate_caches()
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or "torchvision" in sys.modules or _declared("torchvision::nms"):
        return
    library = Path(spec.origin).parent / "_C.so"
    try:
        torch.ops.load_library(str(library))
        return
    except (OSError, ImportError):
        pass
    fragment = torch.library.Library("torchvision", "FRAGMENT")
    fragment.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    fragment.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _DECLARED.append(fragment)


def missing(entry: Entry) -> str | None:
    """The module ``entry``'s library is imported as, when it cannot be found; else None."""
    if entry.library in ("torchvision", "timm", "diffusers"):
        vision_packages()
    module = MODULES[entry.library]
    return module if importlib.util.find_spec(module) is None else None


# ---------------------------------------------------------------- transformers: decoders


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return GPT2LMHeadModel(config)


def _decoder(config_class: str, model_class: str, **extra: Any) -> nn.Module:
    """A causal LM of the Llama family: 2 layers, 64 wide, 4 heads (2 key-value heads)."""
    import transformers

    options: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "use_cache": False,
    }
    options.update(extra)
    config = getattr(transformers, config_class)(**options)
    return getattr(transformers, model_class)(config)


def llama() -> nn.Module:
    return _decoder("LlamaConfig", "LlamaForCausalLM")


def mistral() -> nn.Module:
    return _decoder("MistralConfig", "MistralForCausalLM", sliding_window=64)


def qwen2() -> nn.Module:
    return _decoder("Qwen2Config", "Qwen2ForCausalLM")


def mixtral() -> nn.Module:
    """Four experts, two per token: its experts run as one grouped matrix product."""
    return _decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2)


def gemma() -> nn.Module:
    return _decoder("GemmaConfig", "GemmaForCausalLM", head_dim=16)


def phi() -> nn.Module:
    return _decoder("PhiConfig", "PhiForCausalLM", num_key_value_heads=4)


def gpt_neox() -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return GPTNeoXForCausalLM(config)


def opt() -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        word_embed_proj_dim=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
        use_cache=False,
    )
    return OPTForCausalLM(config)


def mamba() -> nn.Module:
    """A state-space model: the selective scan in plain torch (no fused kernel on the CPU)."""
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=2,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return MambaForCausalLM(config)


# ---------------------------------------------------------------- transformers: encoders, seq2seq, vision


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    return BertForMaskedLM(config)


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        use_cache=False,
    )
    return T5ForConditionalGeneration(config)


def t5_example() -> Example:
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(2, VOCAB, (4, 96), generator=generator)
    target = torch.randint(2, VOCAB, (4, 64), generator=generator)
    return Example((source,), {"decoder_input_ids": target})


def whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=96,
        max_target_positions=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        use_cache=False,
    )
    return WhisperForConditionalGeneration(config)


def whisper_example() -> Example:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(4, 16, 192, generator=generator)  # two frames per encoder position
    tokens = torch.randint(3, VOCAB, (4, 48), generator=generator)
    return Example((features,), {"decoder_input_ids": tokens})


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=64,
        patch_size=4,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
    )
    return ViTForImageClassification(config)


# ---------------------------------------------------------------- timm


def timm_vit() -> nn.Module:
    vision_packages()
    import timm

    return timm.create_model(
        "vit_tiny_patch16_224", img_size=64, patch_size=4, embed_dim=64, depth=2, num_heads=4, num_classes=10
    )


def timm_convnext() -> nn.Module:
    vision_packages()
    import timm

    return timm.create_model("convnext_atto", depths=(1, 1, 2, 1), dims=(16, 32, 64, 128), num_classes=10)


def timm_mobilenetv3() -> nn.Module:
    vision_packages()
    import timm

    return timm.create_model("mobilenetv3_small_050", num_classes=10)


# ---------------------------------------------------------------- torchvision


def tv_resnet() -> nn.Module:
    """A ResNet of basic blocks, one per stage (ResNet-10), 10 classes."""
    vision_packages()
    from torchvision.models.resnet import BasicBlock, ResNet

    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)


def tv_mobilenet_v2() -> nn.Module:
    vision_packages()
    from torchvision.models import mobilenet_v2

    return mobilenet_v2(width_mult=0.25, num_classes=10)


def tv_swin() -> nn.Module:
    vision_packages()
    from torchvision.models import SwinTransformer

    return SwinTransformer(
        patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], num_classes=10
    )


def tv_vit() -> nn.Module:
    vision_packages()
    from torchvision.models import VisionTransformer

    return VisionTransformer(
        image_size=64, patch_size=4, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10
    )


# ---------------------------------------------------------------- diffusers


def unet2d() -> nn.Module:
    vision_packages()
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=8,
    )


def unet2d_example() -> Example:
    generator = torch.Generator().manual_seed(0)
    return Example((torch.randn(4, 3, 32, 32, generator=generator), torch.tensor([10, 20, 30, 40])))


def unet2d_condition() -> nn.Module:
    """Stable Diffusion's denoiser in miniature: cross-attention to a text encoding."""
    vision_packages()
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )


def unet2d_condition_example() -> Example:
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(4, 4, 32, 32, generator=generator)
    text = torch.randn(4, 16, 32, generator=generator)
    return Example((sample, torch.tensor([10, 20, 30, 40])), {"encoder_hidden_states": text})


# ---------------------------------------------------------------- SpikingJelly


class SpikingCNN(nn.Module):
    """Conv -> BN -> LIF twice over [T, B, C, H, W] in SpikingJelly's multi-step mode, then a head."""

    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        from spikingjelly.activation_based import functional, layer, neuron, surrogate

        def block(cin: int) -> nn.Sequential:
            return nn.Sequential(
                layer.Conv2d(cin, channels, 3, padding=1, bias=False),
                layer.BatchNorm2d(channels),
                neuron.LIFNode(surrogate_function=surrogate.ATan(), detach_reset=True),
                layer.MaxPool2d(2),
            )

        self.features = nn.Sequential(block(1), block(channels))
        self.head = nn.Sequential(layer.Flatten(), layer.Linear(channels * 8 * 8, classes))
        functional.set_step_mode(self, "m")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)).mean(0)


def spiking_cnn() -> nn.Module:
    return SpikingCNN()


class SpikingMLP(nn.Module):
    """Three linear layers with parametric LIF neurons over [T, B, features], multi-step."""

    def __init__(self, features: int = 256, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        from spikingjelly.activation_based import functional, layer, neuron

        self.body = nn.Sequential(
            layer.Linear(features, hidden),
            neuron.ParametricLIFNode(detach_reset=True),
            layer.Linear(hidden, hidden),
            neuron.ParametricLIFNode(detach_reset=True),
        )
        self.head = layer.Linear(hidden, classes)
        functional.set_step_mode(self, "m")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).mean(0)


def spiking_mlp() -> nn.Module:
    return SpikingMLP()
