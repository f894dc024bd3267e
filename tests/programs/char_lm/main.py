"""Train a character model on text files; keep the best model by validation loss."""
import argparse
import math

import torch
import torch.nn as nn
import torch.onnx

import nets
import text


def detached(state):
    if state is None or isinstance(state, torch.Tensor):
        return None if state is None else state.detach()
    return tuple(detached(s) for s in state)


def mean_loss(model, data, length):
    model.eval()
    total, count = 0.0, 0
    state = model.start(data.size(0))
    with torch.no_grad():
        for inputs, targets in text.windows(data, length):
            scores, state = model(inputs, state)
            total += targets.numel() * nn.functional.nll_loss(
                scores.reshape(-1, scores.size(-1)), targets.reshape(-1)).item()
            count += targets.numel()
    return total / count


def train_once(model, data, args, lr):
    model.train()
    state = model.start(data.size(0))
    for step, (inputs, targets) in enumerate(text.windows(data, args.length)):
        state = detached(state)
        model.zero_grad()
        scores, state = model(inputs, state)
        loss = nn.NLLLoss()(scores.reshape(-1, scores.size(-1)), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        if step % args.report == 0:
            print(f"  step {step} loss {loss.item():.3f} ppl {math.exp(loss.item()):.2f}")


def main():
    parser = argparse.ArgumentParser(description="character language model")
    parser.add_argument("--data", default="texts")
    parser.add_argument("--arch", default="LSTM", choices=["LSTM", "GRU", "Transformer"])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2.0)
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--tie", action="store_true")
    parser.add_argument("--report", type=int, default=50)
    parser.add_argument("--save", default="best.pt")
    parser.add_argument("--onnx", default="", help="export the final model to this file")
    args = parser.parse_args()

    texts = text.Texts(args.data)
    train = text.into_rows(texts.train, args.rows)
    valid, test = (text.into_rows(ids, 2) for ids in (texts.valid, texts.test))
    vocab = len(texts.alphabet)
    if args.arch == "Transformer":
        model = nets.AttentionModel(vocab, args.width, args.heads, 2 * args.width, args.layers,
                                    args.dropout)
    else:
        model = nets.RecurrentModel(args.arch, vocab, args.width, args.layers, args.dropout,
                                    args.tie)

    lr, best = args.lr, None
    for epoch in range(1, args.epochs + 1):
        train_once(model, train, args, lr)
        loss = mean_loss(model, valid, args.length)
        print(f"epoch {epoch}: valid loss {loss:.3f}")
        if best is None or loss < best:
            with open(args.save, "wb") as f:
                torch.save(model, f)
            best = loss
        else:
            lr /= 2.0

    with open(args.save, "rb") as f:
        model = torch.load(f)
    if args.arch != "Transformer":
        model.rnn.flatten_parameters()
    print(f"test loss {mean_loss(model, test, args.length):.3f}")
    if args.onnx:
        torch.onnx.export(model, (test[:, :args.length], model.start(2)), args.onnx)


if __name__ == "__main__":
    main()
