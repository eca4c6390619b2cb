"""The models of loom's PyTorch benchmarks (issue 22): each a function of a seed returning
(model, make_batch(rank, step) -> (inputs, targets), loss(output, targets)).

    transformer  nn.TransformerEncoder, 4 layers, d 256, 4 heads, ff 1024, seq 64, batch 16,
                 mean-pooled into a linear head (10 classes): 3.3 M parameters
    resnet18     torchvision's resnet18, 10 classes, 64x64 images, batch 8: 11.2 M parameters
                 (torchvision is the benchmark's dependency only: None when it is missing)
    convnet      3 conv (3x3, 32/64/128 channels) + 2 linear, 32x32 images, batch 32: 2.3 M
    mlp          bench/torch/ddp_step.py's MLP 64 -> 8 linear layers of 512 -> 16, batch 512
    gpt          a GPT-like stack with tied embeddings: vocab 4096, d 256, 4 causal blocks,
                 seq 64, batch 8; embedding and output projection share one parameter
Shapes can be scaled down (scale < 1) for quick runs.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def transformer(seed=0, scale=1.0):
    torch.manual_seed(seed)
    d, ff, seq, batch = int(256 * scale) // 4 * 4 or 4, int(1024 * scale) or 4, 64, 16

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(d, 4, ff, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=4)
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            return self.head(self.encoder(x).mean(dim=1))

    def batch_of(rank, step):
        g = _generator(1000 * rank + step)
        return torch.randn(batch, seq, d, generator=g), torch.randint(0, 10, (batch,), generator=g)
    return Model(), batch_of, F.cross_entropy


def resnet18(seed=0, scale=1.0):
    try:
        import torchvision
    except ImportError:
        return None
    torch.manual_seed(seed)
    size = max(32, int(64 * scale))
    model = torchvision.models.resnet18(num_classes=10)

    def batch_of(rank, step):
        g = _generator(1000 * rank + step)
        return (torch.randn(8, 3, size, size, generator=g),
                torch.randint(0, 10, (8,), generator=g))
    return model, batch_of, F.cross_entropy


def convnet(seed=0, scale=1.0):
    torch.manual_seed(seed)
    c1, c2, c3 = (max(4, int(c * scale)) for c in (32, 64, 128))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, c1, 3, padding=1)
            self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
            self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)
            self.fc1 = nn.Linear(c3 * 4 * 4, max(8, int(1024 * scale)))
            self.fc2 = nn.Linear(max(8, int(1024 * scale)), 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = F.max_pool2d(F.relu(self.conv3(x)), 2)
            return self.fc2(F.relu(self.fc1(x.flatten(1))))

    def batch_of(rank, step):
        g = _generator(1000 * rank + step)
        return torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    return Model(), batch_of, F.cross_entropy


def mlp(seed=0, scale=1.0):
    torch.manual_seed(seed)
    width, depth = max(8, int(512 * scale)), 8
    layers, fan_in = [], 64
    for k in range(depth):
        fan_out = 16 if k == depth - 1 else width
        layers.append(nn.Linear(fan_in, fan_out))
        if k + 1 < depth:
            layers.append(nn.ReLU())
        fan_in = fan_out

    def batch_of(rank, step):
        g = _generator(1000 * rank + step)
        return torch.rand(512, 64, generator=g) * 2 - 1, torch.rand(512, 16, generator=g)
    return nn.Sequential(*layers), batch_of, lambda out, y: 0.5 * ((out - y) ** 2).sum() / 512


def gpt(seed=0, scale=1.0):
    torch.manual_seed(seed)
    vocab, d, seq, batch = max(64, int(4096 * scale)), int(256 * scale) // 4 * 4 or 4, 64, 8

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.position = nn.Parameter(torch.randn(seq, d) * 0.02)
            block = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
            self.blocks = nn.TransformerEncoder(block, num_layers=4)
            self.out = nn.Linear(d, vocab, bias=False)
            self.out.weight = self.embed.weight  # tied
            self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

        def forward(self, tokens):
            h = self.embed(tokens) + self.position[: tokens.shape[1]]
            return self.out(self.blocks(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]]))

    def batch_of(rank, step):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=_generator(1000 * rank + step))
        return tokens[:, :-1], tokens[:, 1:]

    def loss(out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return Model(), batch_of, loss


MODELS = {"transformer": transformer, "resnet18": resnet18, "convnet": convnet, "mlp": mlp,
          "gpt": gpt}
