"""Workloads: torchvision CNNs on fake ImageNet-shaped data, BERT pretraining on random tokens.

``build(name, ...)`` returns a ``Workload``: the model, how to make one fake batch on a device,
and how to compute the loss of a batch. Nothing is downloaded: CNNs are built with random
weights, BERT from the JSON configs beside this file.

Names: every torchvision classification model (``resnet50``, ``vgg16``, ``densenet121``,
``mobilenet_v2``, ``inception_v3`` at 299 px, ...), ``bert`` (BERT-Large), ``bert_base`` and
``bert_tiny`` (2 layers, hidden 128, for CPU runs and tests).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ddlbench.errors import UsageError

if TYPE_CHECKING:  # torch is imported where a model is built: checking a name needs none of it
    import torch
    from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
BERT_CONFIGS = {"bert": "bert_large.json", "bert_base": "bert_base.json",
                "bert_tiny": "bert_tiny.json"}
NUM_CLASSES = 1000
# Models whose native input is not 224 px.
NATIVE_IMAGE_SIZE = {"inception_v3": 299}
# Auxiliary classifiers off: the benchmark trains the main head only (as the original did), and
# an auxiliary head left in the model would hold parameters that never get a gradient.
NO_AUX = {"inception_v3", "googlenet"}


@dataclass
class Workload:
    name: str
    model: nn.Module
    unit: str  # "img" or "sen": what one sample is called in the log lines
    make_batch: Callable[[int, torch.device, torch.Generator], tuple]
    loss: Callable[[nn.Module, tuple], torch.Tensor]
    details: dict

    def stats(self) -> dict:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return {"parameters": sum(p.numel() for p in params),
                "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
                "tensors": len(params), **self.details}


def cnn_names() -> list[str]:
    import torchvision
    return sorted(torchvision.models.list_models(module=torchvision.models))


def names() -> list[str]:
    return cnn_names() + list(BERT_CONFIGS)


# CNNs of the survey and of this suite's configs, in every torchvision it supports (a test holds
# this list to torchvision's): a name here is known without importing torchvision.
SURVEY_CNNS = ("alexnet", "densenet121", "googlenet", "inception_v3", "mobilenet_v2",
               "resnet18", "resnet50", "resnet152", "vgg16")


def check(name: str) -> None:
    """A UsageError listing what exists unless ``name`` is a model. BERT and the survey's CNNs
    are checked without importing torchvision: seconds that a launching process (which builds
    no model) would otherwise spend on every run, and a BERT worker on its start-up."""
    if name in BERT_CONFIGS or name in SURVEY_CNNS:
        return
    if name not in cnn_names():
        build(name)  # raises the UsageError listing what exists


# The smallest square image (pixels) each CNN takes in training, (with a batch of 1, with a
# larger batch): known here without importing torch, so that a launching process checks
# ``--image-size`` in no time (the survey's CNNs, as the meta forward of ``smallest_image`` finds
# them; a test holds the two equal), and where the meta forward cannot tell: torchvision builds a
# RegNet's widths from tensor arithmetic that needs data (every RegNet has the same strides; the
# sizes were found on the CPU with regnet_x_400mf and regnet_y_400mf). Batch normalisation in
# training needs 2 values per channel: with a batch of 1, a map of 1 x 1 is too small.
SMALLEST_IMAGE = {"alexnet": (63, 63), "densenet121": (61, 29), "googlenet": (47, 15),
                  "inception_v3": (107, 75), "mobilenet_v2": (33, 1), "resnet18": (33, 1),
                  "resnet50": (33, 1), "resnet152": (33, 1), "vgg16": (32, 32)}
SMALLEST_IMAGE_PREFIX = {"regnet_": (33, 1)}


def check_input(name: str, image_size: int | None, batch_size: int = 2) -> None:
    """A UsageError naming ``--image-size``, the model and the smallest image it takes unless CNN
    ``name`` trains on images of ``image_size`` pixels with a per-worker batch of
    ``batch_size``: before any worker starts, instead of a traceback per rank from its first
    forward. None (the model's native size), a size that is not positive (its own check) and
    BERT pass as they are."""
    if name in BERT_CONFIGS or image_size is None or not isinstance(image_size, int) \
            or image_size <= 0:
        return
    batch = 1 if batch_size == 1 else 2
    known = _smallest_known(name)
    if known is not None:
        smallest, problem = known[batch - 1], None
        if image_size >= smallest:
            return
    else:
        problem = _problem(name, image_size, batch)
        if problem is None:
            return
        smallest = smallest_image(name, batch)
        if smallest is None:
            return  # the meta forward cannot tell: the worker will say
    if image_size < smallest:
        with_one = ""
        if batch == 1:
            larger = (known[1] if known is not None else smallest_image(name, 2)) or smallest
            if larger < smallest:
                with_one = (f" with --batch-size 1 ({larger} px with a batch of 2 or more: "
                            f"batch normalisation in training needs 2 values per channel)")
        raise UsageError(f"--image-size {image_size} is too small for {name}: the smallest "
                         f"image it accepts is {smallest} px{with_one}")
    raise UsageError(f"--image-size {image_size}: {name} does not accept images of "
                     f"{image_size} px ({problem}); its native size is "
                     f"{NATIVE_IMAGE_SIZE.get(name, 224)} px")


def _smallest_known(name: str) -> tuple[int, int] | None:
    if name in SMALLEST_IMAGE:
        return SMALLEST_IMAGE[name]
    for prefix, sizes in SMALLEST_IMAGE_PREFIX.items():
        if name.startswith(prefix):
            return sizes
    return None


def smallest_image(name: str, batch: int = 2) -> int | None:
    """The smallest square image (pixels) CNN ``name`` takes in a training forward of a batch
    of ``batch`` (1, or 2 for any larger), found by forwards on the meta device (shapes only: no
    memory, no compute); None where they cannot tell (the model does not build there, or
    refuses its own native size). Every size above it is taken, as with any stack of
    convolutions and poolings; a model made for one size only (a vision transformer) gives that
    size."""
    return _smallest(name, 1 if batch == 1 else 2)


@functools.cache
def _smallest(name: str, batch: int) -> int | None:
    native = NATIVE_IMAGE_SIZE.get(name, 224)
    if _meta_model(name) is None or _problem(name, native, batch) is not None:
        return None
    low, high = 0, native  # low refused (0 px: nothing), high taken
    while high - low > 1:
        middle = (low + high) // 2
        if _problem(name, middle, batch) is None:
            high = middle
        else:
            low = middle
    return high


@functools.cache
def _problem(name: str, image_size: int, batch: int) -> str | None:
    """Why a training forward of CNN ``name`` on a meta batch of ``batch`` images of
    ``image_size`` px fails (its first line), or None: it runs, or the meta device cannot tell."""
    import torch
    model = _meta_model(name)
    if model is None:
        return None
    try:
        with torch.no_grad():
            model(torch.empty(batch, 3, image_size, image_size, device="meta"))
    except Exception as e:  # RuntimeError (a kernel larger than its input), ValueError
        # (batch normalisation of one value), AssertionError (a transformer's own check)
        text = str(e).strip().splitlines()
        return text[0] if text else type(e).__name__
    return None


@functools.cache
def _meta_model(name: str):
    """CNN ``name`` on the meta device in training mode, or None where it does not build
    there."""
    import torch
    try:
        with torch.device("meta"):
            model = build(name).model
    except Exception:  # e.g. "Cannot copy out of meta tensor" (a RegNet): the worker will say
        return None
    return model.train()


def check_vocab(name: str, vocab_size: int) -> None:
    """A UsageError unless ``--vocab-size vocab_size`` can apply to model ``name``."""
    if name not in BERT_CONFIGS:
        raise UsageError(f"--vocab-size applies to the BERT models, not {name}")
    if vocab_size <= 0:
        raise UsageError(f"--vocab-size must be positive, got {vocab_size}")


def build(name: str, image_size: int | None = None, sentence_len: int = 64,
          num_classes: int = NUM_CLASSES, attention: str | None = None,
          vocab_size: int | None = None) -> Workload:
    """``attention``: BERT's attention implementation in transformers (None: its default,
    SDPA; "eager": plain matmuls and softmax, which run on the meta device). ``vocab_size``:
    BERT's vocabulary in place of its config's (its word embeddings and masked-LM output)."""
    if name in BERT_CONFIGS:
        return _bert(name, sentence_len, attention, vocab_size)
    if vocab_size is not None:
        check_vocab(name, vocab_size)  # raises: not a BERT
    if name in cnn_names():
        return _cnn(name, image_size or NATIVE_IMAGE_SIZE.get(name, 224), num_classes)
    raise UsageError(f"unknown model {name!r}; known: torchvision classification models "
                     f"(e.g. resnet50, vgg16, densenet121, mobilenet_v2, inception_v3) and "
                     f"{', '.join(BERT_CONFIGS)}")


def _cnn(name, image_size, num_classes) -> Workload:
    import torch
    import torch.nn.functional as F
    import torchvision
    if image_size <= 0:
        raise UsageError(f"--image-size must be positive, got {image_size}")
    kwargs = {"weights": None, "num_classes": num_classes}
    if name in NO_AUX:
        kwargs.update(aux_logits=False, init_weights=True)
    try:
        model = torchvision.models.get_model(name, **kwargs)
    except Exception as e:  # torchvision rejects some sizes/options per model
        raise UsageError(f"cannot build {name}: {e}") from None

    def make_batch(batch_size, device, gen):
        images = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
        targets = torch.randint(0, num_classes, (batch_size,), generator=gen)
        return images.to(device), targets.to(device)

    def loss(module, batch):
        images, targets = batch
        return F.cross_entropy(module(images), targets)

    return Workload(name, model, "img", make_batch, loss,
                    {"image_size": image_size, "num_classes": num_classes})


def bert_config(name: str):
    from transformers import BertConfig
    return BertConfig.from_json_file(os.path.join(HERE, BERT_CONFIGS[name]))


def _bert(name, sentence_len, attention=None, vocab_size=None) -> Workload:
    import torch
    from transformers import BertForPreTraining
    config = bert_config(name)
    if attention is not None:
        config._attn_implementation = attention
    if vocab_size is not None:
        check_vocab(name, vocab_size)
        config.vocab_size = vocab_size
    if not (0 < sentence_len <= config.max_position_embeddings):
        raise UsageError(f"--sentence-len must be in 1..{config.max_position_embeddings}, "
                         f"got {sentence_len}")
    model = BertForPreTraining(config)
    vocab = config.vocab_size
    mask_prob = 0.15

    def make_batch(batch_size, device, gen):
        shape = (batch_size, sentence_len)
        input_ids = torch.randint(0, vocab, shape, generator=gen)
        segment = torch.randint(1, sentence_len, (batch_size, 1), generator=gen)
        token_type_ids = (torch.arange(sentence_len).expand(shape) >= segment).long()
        attention_mask = torch.ones(shape, dtype=torch.long)
        masked = torch.rand(shape, generator=gen) < mask_prob
        masked[:, 0] = True  # at least one prediction per sequence
        mlm_labels = torch.where(masked, torch.randint(0, vocab, shape, generator=gen),
                                 torch.full(shape, -100))
        nsp_labels = torch.randint(0, 2, (batch_size,), generator=gen)
        return tuple(t.to(device) for t in
                     (input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels))

    def loss(module, batch):
        input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels = batch
        out = module(input_ids=input_ids, token_type_ids=token_type_ids,
                     attention_mask=attention_mask, labels=mlm_labels,
                     next_sentence_label=nsp_labels)
        return out.loss  # masked-LM + next-sentence-prediction

    return Workload(name, model, "sen", make_batch, loss,
                    {"sentence_len": sentence_len, "layers": config.num_hidden_layers,
                     "hidden": config.hidden_size, "vocab_size": vocab})
