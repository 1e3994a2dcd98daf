"""The core every component builds on: the batch, tensor ops, packing and micro-batches, model loading and
inputs, log-probs, LoRA, sampling settings and typed configs. It imports no component and nothing of the loop,
the data, the CLI or the recipes, so a component can import any of it."""
