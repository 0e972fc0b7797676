"""Callbacks for training frameworks, one module each, importing its framework
only when that module is imported (``import xp`` never imports them):

- ``xp.integrations.lightning``: ``XpCallback``, a PyTorch Lightning callback;
- ``xp.integrations.huggingface``: ``XpCallback``, a ``transformers.TrainerCallback``.
"""
