"""Parity: prove every engine trains the same model to the same weights.

Reference models are described once (`architectures`), built for torch (`torch_models`) and for
Keras (`keras_models`) from one seeded set of initial weights, trained by `worker` under each
engine and launcher and by a plain single-process loop, and compared by `harness`. Model
builders import the frameworks (torch, keras), never an engine: engines stay in their backends.
"""
