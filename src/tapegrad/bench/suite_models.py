"""The models of ``tapegrad bench suite``: each written once against a ``torch``-like module
``T`` (``tapegrad`` or ``torch``), so the same source builds and trains under both.

A model is a ``Spec``: ``build(T)`` returns the ``nn.Module``, ``batch(rng)`` one batch as
numpy arrays (floats in float64, cast to the run's dtype; integers stay int64),
``loss(T, net, *batch)`` the scalar loss, ``optimizer(T, params)`` its optimizer. None of
them is one of the project's own benchmark models (char GPT, digits CNN, spiral MLP), and
none draws random numbers inside the step (a VAE's noise is part of its batch), so two
libraries given the same weights and batch do the same arithmetic.
"""
import numpy as np


class Spec:
    """One suite model: name, family, one-line description and its four functions."""

    def __init__(self, name, family, describe, build, batch, loss, optimizer):
        self.name, self.family, self.describe = name, family, describe
        self.build, self.batch, self.loss, self.optimizer = build, batch, loss, optimizer


SPECS = {}


def spec(name, family, describe, batch, loss, optimizer):
    """Decorator: register the builder below it as the suite model ``name``."""
    def register(build):
        SPECS[name] = Spec(name, family, describe, build, batch, loss, optimizer)
        return build
    return register


def _ce(T, net, x, y):
    return T.nn.functional.cross_entropy(net(x), y)


def _ce_tokens(T, net, x, y):
    logits = net(x)
    return T.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _images(n, c, hw, classes):
    return lambda rng: (rng.standard_normal((n, c, hw, hw)), rng.integers(0, classes, n))


def _tokens(n, length, vocab, classes=None):
    def batch(rng):
        x = rng.integers(0, vocab, (n, length))
        if classes is None:  # next-token targets
            return x, np.roll(x, -1, axis=1)
        return x, rng.integers(0, classes, n)
    return batch


# --- transformers ----------------------------------------------------------------------------
def _rotary(length, dim):
    """cos and sin tables of rotary positions, (length, dim), halves repeated."""
    inv = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    angles = np.outer(np.arange(length), inv)
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles), np.sin(angles)


@spec("gpt_rope", "transformer",
      "decoder, pre-norm RMSNorm, rotary positions, SwiGLU MLP, causal softmax (2x64, 4 heads)",
      _tokens(8, 32, 64), _ce_tokens,
      lambda T, p: T.optim.AdamW(p, lr=1e-3, weight_decay=0.1))
def gpt_rope(T, vocab=64, width=64, heads=4, layers=2, length=32):
    nn = T.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(width), nn.RMSNorm(width)
            self.qkv = nn.Linear(width, 3 * width, bias=False)
            self.proj = nn.Linear(width, width, bias=False)
            self.gate = nn.Linear(width, 2 * width, bias=False)
            self.up = nn.Linear(width, 2 * width, bias=False)
            self.down = nn.Linear(2 * width, width, bias=False)

        def rotate(self, x, cos, sin):
            half = x.shape[-1] // 2
            turned = T.cat([-x[..., half:], x[..., :half]], dim=-1)
            return x * cos + turned * sin

        def forward(self, x, cos, sin, mask):
            B, L, D = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(D, dim=-1)
            q, k, v = [t.view(B, L, heads, D // heads).transpose(1, 2) for t in (q, k, v)]
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            scores = (q @ k.transpose(-2, -1)) * (D // heads) ** -0.5
            att = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, L, D)
            x = x + self.proj(y)
            h = self.norm2(x)
            return x + self.down(T.nn.functional.silu(self.gate(h)) * self.up(h))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.norm = nn.RMSNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)
            cos, sin = _rotary(length, width // heads)
            self.register_buffer("cos", T.tensor(cos))
            self.register_buffer("sin", T.tensor(sin))
            self.register_buffer("mask", T.triu(T.ones(length, length), diagonal=1) > 0)

        def forward(self, idx):
            L = idx.shape[1]
            x = self.tok(idx)
            cos, sin, mask = self.cos[:L], self.sin[:L], self.mask[:L, :L]
            for block in self.blocks:
                x = block(x, cos, sin, mask)
            return self.head(self.norm(x))

    return Net()


@spec("bert_postnorm", "transformer",
      "encoder, post-norm LayerNorm, learned positions, GELU MLP, SDPA, mean-pool classifier",
      _tokens(16, 24, 100, classes=10), _ce,
      lambda T, p: T.optim.Adam(p, lr=1e-3))
def bert_postnorm(T, vocab=100, width=64, heads=4, layers=2, length=24, classes=10):
    nn = T.nn
    F = T.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            B, L, D = x.shape
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            q, k, v = [t.view(B, L, heads, D // heads).transpose(1, 2) for t in (q, k, v)]
            y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, D)
            x = self.norm1(x + self.proj(y))
            return self.norm2(x + self.mlp(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(length, width)
            self.norm = nn.LayerNorm(width)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.head = nn.Linear(width, classes)

        def forward(self, idx):
            x = self.norm(self.tok(idx) + self.pos.weight[:idx.shape[1]])
            return self.head(self.blocks(x).mean(dim=1))

    return Net()


@spec("vit_mha", "transformer",
      "ViT: conv patch embedding, class token, pre-norm, nn.MultiheadAttention, GELU MLP",
      _images(16, 3, 16, 10), _ce,
      lambda T, p: T.optim.AdamW(p, lr=1e-3))
def vit_mha(T, width=48, heads=4, layers=2, patch=4, image=16, classes=10):
    nn = T.nn
    tokens = (image // patch) ** 2 + 1

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                     nn.Linear(2 * width, width))

        def forward(self, x):
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(3, width, patch, stride=patch)
            self.cls = nn.Parameter(T.randn(1, 1, width) * 0.02)
            self.pos = nn.Parameter(T.randn(1, tokens, width) * 0.02)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, classes)

        def forward(self, x):
            x = self.embed(x).flatten(2).transpose(1, 2)
            x = T.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            return self.head(self.norm(self.blocks(x))[:, 0])

    return Net()


@spec("seq2seq_transformer", "transformer",
      "nn.Transformer encoder-decoder (post-norm, ReLU), learned positions, causal target",
      lambda rng: (rng.integers(0, 40, (8, 12)), rng.integers(0, 40, (8, 10)),
                   rng.integers(0, 40, (8, 10))),
      lambda T, net, src, tgt_in, tgt_out: T.nn.functional.cross_entropy(
          net(src, tgt_in).reshape(-1, 40), tgt_out.reshape(-1)),
      lambda T, p: T.optim.Adam(p, lr=5e-4))
def seq2seq_transformer(T, vocab=40, width=32, heads=4, length=16):
    nn = T.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_tok, self.tgt_tok = nn.Embedding(vocab, width), nn.Embedding(vocab, width)
            self.pos = nn.Embedding(length, width)
            self.core = nn.Transformer(width, heads, num_encoder_layers=1,
                                       num_decoder_layers=1, dim_feedforward=64, dropout=0.0,
                                       batch_first=True)
            self.head = nn.Linear(width, vocab)
            self.register_buffer("causal", T.triu(T.ones(length, length), diagonal=1) > 0)

        def forward(self, src, tgt):
            S, L = src.shape[1], tgt.shape[1]
            s = self.src_tok(src) + self.pos.weight[:S]
            t = self.tgt_tok(tgt) + self.pos.weight[:L]
            return self.head(self.core(s, t, tgt_mask=self.causal[:L, :L]))

    return Net()


# --- convolutional ---------------------------------------------------------------------------
@spec("cnn_plain", "cnn", "conv-ReLU-maxpool x2, linear head (3x16x16, batch 32)",
      _images(32, 3, 16, 10), _ce,
      lambda T, p: T.optim.SGD(p, lr=0.05, momentum=0.9))
def cnn_plain(T):
    nn = T.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


@spec("resnet_bn", "cnn",
      "ResNet: BatchNorm basic blocks, strided 1x1 shortcut, AdaptiveAvgPool2d (batch 16)",
      _images(16, 3, 16, 10), _ce,
      lambda T, p: T.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4))
def resnet_bn(T, widths=(16, 32)):
    nn = T.nn
    F = T.nn.functional

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(h)) + self.short(x))

    return nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False),
                         nn.BatchNorm2d(widths[0]), nn.ReLU(),
                         Basic(widths[0], widths[0], 1), Basic(widths[0], widths[1], 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[1], 10))


@spec("mobilenet_dw", "cnn",
      "depthwise separable blocks (groups=C 3x3, BatchNorm, ReLU6, 1x1), mean pool (Adam)",
      _images(16, 3, 16, 10), _ce,
      lambda T, p: T.optim.Adam(p, lr=2e-3))
def mobilenet_dw(T, widths=(16, 32, 48)):
    nn = T.nn
    F = T.nn.functional

    class Separable(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.dw = nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False)
            self.bn1 = nn.BatchNorm2d(cin)
            self.pw = nn.Conv2d(cin, cout, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)

        def forward(self, x):
            return F.relu6(self.bn2(self.pw(F.relu6(self.bn1(self.dw(x))))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, widths[0], 3, padding=1)
            self.blocks = nn.Sequential(Separable(widths[0], widths[1], 2),
                                        Separable(widths[1], widths[2], 1),
                                        Separable(widths[2], widths[2], 2))
            self.head = nn.Linear(widths[2], 10)

        def forward(self, x):
            return self.head(self.blocks(F.relu6(self.stem(x))).mean(dim=(2, 3)))

    return Net()


@spec("unet", "cnn",
      "U-Net: GroupNorm conv pairs, maxpool down, ConvTranspose2d up, skip concat, BCE map",
      lambda rng: (rng.standard_normal((8, 1, 16, 16)),
                   (rng.random((8, 1, 16, 16)) > 0.5).astype(np.float64)),
      lambda T, net, x, m: T.nn.functional.binary_cross_entropy_with_logits(net(x), m),
      lambda T, p: T.optim.Adam(p, lr=1e-3))
def unet(T, w=8):
    nn = T.nn

    def pair(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(4, cout),
                             nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.down1, self.down2, self.mid = pair(1, w), pair(w, 2 * w), pair(2 * w, 4 * w)
            self.pool = nn.MaxPool2d(2)
            self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
            self.dec2 = pair(4 * w, 2 * w)
            self.up1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
            self.dec1 = pair(2 * w, w)
            self.out = nn.Conv2d(w, 1, 1)

        def forward(self, x):
            s1 = self.down1(x)
            s2 = self.down2(self.pool(s1))
            h = self.mid(self.pool(s2))
            h = self.dec2(T.cat([self.up2(h), s2], dim=1))
            return self.out(self.dec1(T.cat([self.up1(h), s1], dim=1)))

    return Net()


# --- recurrent -------------------------------------------------------------------------------
@spec("lstm_tagger", "recurrent",
      "embedding, 2-layer nn.LSTM (batch_first), per-token tags (16 x 20)",
      _tokens(16, 20, 50), _ce_tokens,
      lambda T, p: T.optim.Adam(p, lr=2e-3))
def lstm_tagger(T, vocab=50, width=32, hidden=48):
    nn = T.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.rnn = nn.LSTM(width, hidden, num_layers=2, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, idx):
            return self.head(self.rnn(self.tok(idx))[0])

    return Net()


@spec("gru_seq2seq_attn", "recurrent",
      "GRU encoder, GRUCell decoder loop with dot-product attention, teacher forcing",
      lambda rng: (rng.integers(0, 30, (16, 10)), rng.integers(0, 30, (16, 8)),
                   rng.integers(0, 30, (16, 8))),
      lambda T, net, src, tgt_in, tgt_out: T.nn.functional.cross_entropy(
          net(src, tgt_in).reshape(-1, 30), tgt_out.reshape(-1)),
      lambda T, p: T.optim.Adam(p, lr=1e-3))
def gru_seq2seq_attn(T, vocab=30, width=32, hidden=48):
    nn = T.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_tok, self.tgt_tok = nn.Embedding(vocab, width), nn.Embedding(vocab, width)
            self.encoder = nn.GRU(width, hidden, batch_first=True)
            self.cell = nn.GRUCell(width, hidden)
            self.combine = nn.Linear(2 * hidden, hidden)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, src, tgt):
            memory, h = self.encoder(self.src_tok(src))
            h = h[0]
            emb = self.tgt_tok(tgt)
            outs = []
            for t in range(tgt.shape[1]):
                h = self.cell(emb[:, t], h)
                weights = (memory @ h.unsqueeze(2)).softmax(dim=1)
                context = (weights * memory).sum(dim=1)
                outs.append(T.tanh(self.combine(T.cat([h, context], dim=1))))
            return self.head(T.stack(outs, dim=1))

    return Net()


# --- MLP-Mixer and MLPs ----------------------------------------------------------------------
@spec("mixer", "mixer", "MLP-Mixer: 4x4 patches, token- and channel-mixing GELU MLPs, LayerNorm",
      _images(16, 3, 16, 10), _ce,
      lambda T, p: T.optim.AdamW(p, lr=1e-3, weight_decay=0.05))
def mixer(T, width=64, patch=4, image=16, blocks=2):
    nn = T.nn
    tokens = (image // patch) ** 2

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(),
                                        nn.Linear(2 * tokens, tokens))
            self.channels = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                          nn.Linear(2 * width, width))

        def forward(self, x):
            x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
            return x + self.channels(self.norm2(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(3 * patch * patch, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(blocks)])
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, 10)

        def forward(self, x):
            B, C, Hh, W = x.shape
            p = x.reshape(B, C, Hh // patch, patch, W // patch, patch)
            p = p.permute(0, 2, 4, 1, 3, 5).reshape(B, tokens, C * patch * patch)
            return self.head(self.norm(self.blocks(self.embed(p))).mean(dim=1))

    return Net()


@spec("mlp_deep_tanh", "mlp", "8 tanh layers of 64, MSE regression (batch 128, SGD momentum)",
      lambda rng: (rng.standard_normal((128, 16)), rng.standard_normal((128, 4))),
      lambda T, net, x, y: T.nn.functional.mse_loss(net(x), y),
      lambda T, p: T.optim.SGD(p, lr=0.02, momentum=0.9))
def mlp_deep_tanh(T, depth=8, width=64):
    nn = T.nn
    layers = [nn.Linear(16, width), nn.Tanh()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


@spec("mlp_wide_silu", "mlp",
      "2 hidden of 512 (SiLU, LeakyReLU), label-smoothed cross-entropy (batch 256, Adam)",
      lambda rng: (rng.standard_normal((256, 64)), rng.integers(0, 10, 256)),
      lambda T, net, x, y: T.nn.functional.cross_entropy(net(x), y, label_smoothing=0.1),
      lambda T, p: T.optim.Adam(p, lr=1e-3))
def mlp_wide_silu(T, width=512):
    nn = T.nn
    return nn.Sequential(nn.Linear(64, width), nn.SiLU(), nn.Linear(width, width),
                         nn.LeakyReLU(0.1), nn.Linear(width, 10))


@spec("mlp_elu_layernorm", "mlp",
      "4 residual ELU layers of 128 with LayerNorm, Softplus output, Huber loss (AdamW)",
      lambda rng: (rng.standard_normal((64, 32)), rng.random((64, 8))),
      lambda T, net, x, y: T.nn.functional.huber_loss(net(x), y, delta=0.5),
      lambda T, p: T.optim.AdamW(p, lr=1e-3))
def mlp_elu_layernorm(T, width=128, depth=4):
    nn = T.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(32, width)
            self.layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width),
                                                       nn.ELU()) for _ in range(depth)])
            self.out = nn.Sequential(nn.Linear(width, 8), nn.Softplus())

        def forward(self, x):
            h = self.inp(x)
            for layer in self.layers:
                h = h + layer(h)
            return self.out(h)

    return Net()


# --- generative and graph --------------------------------------------------------------------
def _vae_batch(rng):
    x = (rng.random((64, 64)) > 0.7).astype(np.float64)
    return x, rng.standard_normal((64, 8))


def _vae_loss(T, net, x, eps):
    logits, mu, logvar = net(x, eps)
    F = T.nn.functional
    recon = F.binary_cross_entropy_with_logits(logits, x, reduction="sum")
    kl = -0.5 * (1 + logvar - mu * mu - logvar.exp()).sum()
    return (recon + kl) / x.shape[0]


@spec("vae", "generative",
      "VAE: MLP encoder to mean/log-variance, reparameterised sample, BCE + KL (noise in batch)",
      _vae_batch, _vae_loss, lambda T, p: T.optim.Adam(p, lr=1e-3))
def vae(T, dim=64, hidden=128, latent=8):
    nn = T.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
            self.mu, self.logvar = nn.Linear(hidden, latent), nn.Linear(hidden, latent)
            self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(),
                                     nn.Linear(hidden, dim))

        def forward(self, x, eps):
            h = self.enc(x)
            mu, logvar = self.mu(h), self.logvar(h)
            return self.dec(mu + (0.5 * logvar).exp() * eps), mu, logvar

    return Net()


def _graph(rng, nodes=200, feats=32, classes=6, degree=4):
    """A random graph with self-loops: features, sym.-normalised dense adjacency, labels,
    the (source, target) edge lists and the indices of the labelled nodes."""
    src = np.repeat(np.arange(nodes), degree)
    dst = rng.integers(0, nodes, nodes * degree)
    adj = np.zeros((nodes, nodes))
    adj[src, dst] = adj[dst, src] = 1.0
    adj[np.arange(nodes), np.arange(nodes)] = 1.0
    d = adj.sum(1) ** -0.5
    labels = rng.integers(0, classes, nodes)
    train = np.sort(rng.choice(nodes, nodes // 2, replace=False))
    rows, cols = np.nonzero(adj)
    return rng.standard_normal((nodes, feats)), adj * d[:, None] * d[None, :], labels, \
        rows, cols, train


@spec("gcn_dense", "graph",
      "2-layer GCN, dense normalised adjacency (200 nodes), masked node classification",
      lambda rng: (lambda g: (g[0], g[1], g[2], g[5]))(_graph(rng)),
      lambda T, net, x, adj, y, train: T.nn.functional.cross_entropy(
          net(x, adj)[train], y[train]),
      lambda T, p: T.optim.Adam(p, lr=1e-2, weight_decay=5e-4))
def gcn_dense(T, feats=32, hidden=32, classes=6):
    nn = T.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(feats, hidden)
            self.w2 = nn.Linear(hidden, classes)

        def forward(self, x, adj):
            return adj @ self.w2(T.relu(adj @ self.w1(x)))

    return Net()


@spec("mpnn_edges", "graph",
      "message passing over an edge list: gather, edge MLP, index_add aggregation, GRUCell",
      lambda rng: (lambda g: (g[0], g[3], g[4], g[2], g[5]))(_graph(rng)),
      lambda T, net, x, rows, cols, y, train: T.nn.functional.cross_entropy(
          net(x, rows, cols)[train], y[train]),
      lambda T, p: T.optim.AdamW(p, lr=3e-3))
def mpnn_edges(T, feats=32, hidden=32, classes=6, rounds=2):
    nn = T.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(feats, hidden)
            self.message = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU())
            self.update = nn.GRUCell(hidden, hidden)
            self.head = nn.Linear(hidden, classes)

        def forward(self, x, rows, cols):
            h = self.inp(x)
            for _ in range(rounds):
                m = self.message(T.cat([h[rows], h[cols]], dim=1))
                agg = T.zeros_like(h).index_add(0, rows, m)
                h = self.update(agg, h)
            return self.head(h)

    return Net()
