"""Recipes beside RL on the same building blocks: reward-model training and the tiny-model builders."""
