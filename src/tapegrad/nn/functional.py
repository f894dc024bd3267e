"""``tapegrad.nn.functional`` (as ``torch.nn.functional``)."""
