"""Train a character model on text files, stopping early when validation stops improving."""
import argparse
import math

import torch
import torch.nn as nn
import torch.onnx

import nets
import text


def one_pass(model, data, length, rate=None, clip=None, report=0):
    """Mean loss per character over ``data``; trains with plain SGD when ``rate`` is given."""
    model.train(rate is not None)
    state = model.start(data.size(0))
    total, count = 0.0, 0
    for step, (inputs, targets) in enumerate(text.windows(data, length)):
        with torch.set_grad_enabled(rate is not None):
            scores, state = model(inputs, model.carry(state))
            loss = nn.functional.nll_loss(scores.flatten(0, 1), targets.flatten())
        if rate is not None:
            model.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-rate)
        total += loss.item() * targets.numel()
        count += targets.numel()
        if report and step % report == 0:
            print(f"  window {step}: {loss.item():.3f} nats, {math.exp(loss.item()):.2f} ppl")
    return total / count


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
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--tie", action="store_true")
    parser.add_argument("--report", type=int, default=50)
    parser.add_argument("--save", default="best.pt")
    parser.add_argument("--onnx", default="", help="also export the best model to this file")
    args = parser.parse_args()

    texts = text.Texts(args.data)
    train = text.into_rows(texts.train, args.rows)
    valid, test = text.into_rows(texts.valid, 2), text.into_rows(texts.test, 2)
    vocab = len(texts.alphabet)
    if args.arch == "Transformer":
        model = nets.AttentionModel(vocab, args.width, args.heads, 2 * args.width, args.layers,
                                    args.dropout)
    else:
        model = nets.RecurrentModel(args.arch, vocab, args.width, args.layers, args.dropout,
                                    args.tie)

    best, waited = math.inf, 0
    for epoch in range(1, args.epochs + 1):
        one_pass(model, train, args.length, args.lr, args.clip, args.report)
        loss = one_pass(model, valid, args.length)
        print(f"epoch {epoch}: validation {loss:.3f} nats per character")
        if loss < best:
            best, waited = loss, 0
            with open(args.save, "wb") as f:
                torch.save(model, f)
        else:
            waited += 1
            if waited > args.patience:
                break

    with open(args.save, "rb") as f:
        model = torch.load(f)
    if isinstance(model, nets.RecurrentModel):
        model.rnn.flatten_parameters()
    print(f"test: {one_pass(model, test, args.length):.3f} nats per character")
    if args.onnx:
        torch.onnx.export(model, (test[:, :args.length], model.start(2)), args.onnx)


if __name__ == "__main__":
    main()
