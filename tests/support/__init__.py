"""Helpers shared by several test files, so that no test file imports another (fixtures shared by the files of a folder
live in its conftest.py). One module a topic: sglang, tools, multi_turn, vlm, checkpoints."""
