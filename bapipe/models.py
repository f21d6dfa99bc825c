"""Layer stacks the planner profiles: each model is an ordered list of layers.

Every stack is a plain list of ``nn.Module`` whose i-th layer takes the (i-1)-th layer's output,
which is exactly what DeepSpeed's ``PipelineModule`` needs. Layers that carry more than one tensor
(GNMT's encoder output beside the target tokens) pass tuples, as DeepSpeed's pipeline allows.

torchvision is not available beside this torch, so VGG-16 and ResNet-50 are rebuilt here with the
same layer structure, scaled down by ``width`` (default 1/4 of the channels, 224x224 images) so
that a CPU profile takes seconds. Width scales parameters and FLOPs alike (both go as width^2),
so the ratio of compute to gradient all-reduce traffic stays that of the full-size model; the
activations sent between stages shrink only as width, so at 1/4 width they weigh 4x more against
compute than in the full-size model, which handicaps pipelines of these stacks. GNMT-like and
GPT-like are scaled the same way (dim 256).
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LayerStack:
    """A model as the pipeline sees it: layers in order, a batch maker and the loss."""

    name: str
    layers: list
    make_batch: Callable[[int], tuple]  # micro-batch size -> (inputs, labels)
    loss_fn: Callable


# ---------------------------------------------------------------- GPT-like decoder stack
class TokenEmbedding(nn.Module):
    def __init__(self, vocab, dim, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))

    def forward(self, tokens):
        return self.tok(tokens) + self.pos[: tokens.shape[1]]


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class OutputHead(nn.Module):
    def __init__(self, dim, vocab):
        super().__init__()
        self.ln, self.out = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


def token_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def gpt_like(vocab=8192, dim=256, heads=4, blocks=8, seq_len=128, seed=0) -> LayerStack:
    """Embedding, ``blocks`` transformer blocks, output head: the head's vocab projection makes
    the last stage heavy, the pitfall a uniform split falls into."""
    torch.manual_seed(seed)
    layers = [TokenEmbedding(vocab, dim, seq_len)]
    layers += [TransformerBlock(dim, heads) for _ in range(blocks)]
    layers.append(OutputHead(dim, vocab))

    def make_batch(micro_batch):
        tokens = torch.randint(0, vocab, (micro_batch, seq_len + 1))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return LayerStack("gpt-like", layers, make_batch, token_loss)


# ---------------------------------------------------------------- VGG-16
def _conv_relu(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=False))


class ConvPool(nn.Module):
    """The last conv of a VGG block, with the block's max-pool."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv = _conv_relu(cin, cout)

    def forward(self, x):
        return F.max_pool2d(self.conv(x), 2)


class Classifier(nn.Module):
    def __init__(self, features, hidden, classes, flatten=True):
        super().__init__()
        self.flatten = flatten
        self.fc = nn.Linear(features, hidden) if hidden else nn.Linear(features, classes)
        self.act = nn.ReLU() if hidden else nn.Identity()

    def forward(self, x):
        return self.act(self.fc(torch.flatten(x, 1) if self.flatten else x))


def image_batch(image, classes):
    def make_batch(micro_batch):
        return torch.randn(micro_batch, 3, image, image), torch.randint(0, classes, (micro_batch,))

    return make_batch


def vgg16(width=0.25, image=224, classes=1000, seed=0) -> LayerStack:
    """VGG-16 (configuration D): 13 convolutions and 3 fully connected layers, one layer each."""
    torch.manual_seed(seed)
    plan = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    layers, cin = [], 3
    for block in plan:
        for i, c in enumerate(block):
            cout = max(8, int(c * width))
            layers.append(ConvPool(cin, cout) if i == len(block) - 1 else _conv_relu(cin, cout))
            cin = cout
    side = image // 32
    hidden = max(64, int(4096 * width))
    layers += [
        Classifier(cin * side * side, hidden, classes),
        Classifier(hidden, hidden, classes, flatten=False),
        Classifier(hidden, 0, classes, flatten=False),
    ]
    return LayerStack("vgg16", layers, image_batch(image, classes), F.cross_entropy)


# ---------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = 4 * mid
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x):
        return F.relu(self.body(x) + self.skip(x))


class Stem(nn.Module):
    def __init__(self, cout):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, cout, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, stride=2, padding=1)


class PoolFc(nn.Module):
    def __init__(self, cin, classes):
        super().__init__()
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet50(width=0.25, image=224, classes=1000, seed=0) -> LayerStack:
    """ResNet-50: stem, 16 bottleneck blocks (3, 4, 6, 3), pooled classifier: 18 layers."""
    torch.manual_seed(seed)
    base = max(8, int(64 * width))
    layers, cin = [Stem(base)], base
    for stage, blocks in enumerate([3, 4, 6, 3]):
        mid = base * 2**stage
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, stride=2 if i == 0 and stage > 0 else 1))
            cin = 4 * mid
    layers.append(PoolFc(cin, classes))
    return LayerStack("resnet50", layers, image_batch(image, classes), F.cross_entropy)


# ---------------------------------------------------------------- GNMT-like seq2seq
class SourceEmbedding(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)

    def forward(self, batch):
        src, tgt = batch[:, 0], batch[:, 1]
        return self.emb(src), tgt


class EncoderLSTM(nn.Module):
    """GNMT's first encoder layer is bidirectional, the rest are unidirectional with residuals."""

    def __init__(self, dim, bidirectional=False, residual=False):
        super().__init__()
        self.residual = residual
        self.lstm = nn.LSTM(dim, dim // 2 if bidirectional else dim, batch_first=True, bidirectional=bidirectional)

    def forward(self, inputs):
        x, tgt = inputs
        y, _ = self.lstm(x)
        return (x + y if self.residual else y), tgt


class TargetEmbedding(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)

    def forward(self, inputs):
        enc, tgt = inputs
        return enc, self.emb(tgt)


class DecoderLSTM(nn.Module):
    """A decoder LSTM layer fed with dot-product attention over the encoder output."""

    def __init__(self, dim, residual=False):
        super().__init__()
        self.residual = residual
        self.lstm = nn.LSTM(2 * dim, dim, batch_first=True)

    def forward(self, inputs):
        enc, x = inputs
        context = F.scaled_dot_product_attention(x, enc, enc)
        y, _ = self.lstm(torch.cat([x, context], dim=-1))
        return enc, (x + y if self.residual else y)


class Generator(nn.Module):
    def __init__(self, dim, vocab):
        super().__init__()
        self.out = nn.Linear(dim, vocab)

    def forward(self, inputs):
        return self.out(inputs[1])


def gnmt_like(vocab=8192, dim=256, depth=4, seq_len=32, seed=0) -> LayerStack:
    """GNMT-like: embeddings, ``depth`` encoder and ``depth`` decoder LSTM layers, generator."""
    torch.manual_seed(seed)
    layers = [SourceEmbedding(vocab, dim), EncoderLSTM(dim, bidirectional=True)]
    layers += [EncoderLSTM(dim, residual=i > 0) for i in range(depth - 1)]
    layers.append(TargetEmbedding(vocab, dim))
    layers += [DecoderLSTM(dim, residual=i > 1) for i in range(depth)]
    layers.append(Generator(dim, vocab))

    def make_batch(micro_batch):
        # source and target tokens travel as one tensor so the first stage takes a single input
        pair = torch.randint(0, vocab, (micro_batch, 2, seq_len))
        return pair, torch.randint(0, vocab, (micro_batch, seq_len))

    return LayerStack("gnmt-like", layers, make_batch, token_loss)


def sequential(model: nn.Sequential, make_batch, loss_fn, name="sequential") -> LayerStack:
    """Any ``nn.Sequential`` is a stack already."""
    return LayerStack(name, list(model), make_batch, loss_fn)


MODELS = {"gpt-like": gpt_like, "vgg16": vgg16, "resnet50": resnet50, "gnmt-like": gnmt_like}


def build(name: str, **kwargs) -> LayerStack:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {sorted(MODELS)}")
    return MODELS[name](**kwargs)
