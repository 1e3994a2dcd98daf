"""`python -m lightning_rl.cli fit ...`: the same command line as `lightning-rl`."""

from lightning_rl.command import entry

if __name__ == "__main__":
    entry()
