"""`python cli.py fit --config configs/grpo.yaml`: a thin shim over `lightning_rl.cli`."""

from lightning_rl.cli import main

if __name__ == "__main__":
    main()
